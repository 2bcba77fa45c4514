"""The supply chain: what an image says of itself and who vouches for it. attest (provenance, SBOM, signing) and
verify (a signature and its claims checked against the image, by digest)."""
