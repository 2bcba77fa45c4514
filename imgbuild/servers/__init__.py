"""The shared GPU server: `imgbuild run` and its containers, the host's ledger, the reaper, the batch queue, usage
accounting, enforced mode (users through sudo) and `imgbuild doctor`."""
