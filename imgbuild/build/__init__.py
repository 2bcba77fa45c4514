"""Stages 2, 3 and 5 and the pipeline that runs them: plan (pure), resolve (the plan's edge: registry, local images,
the base's pins), render (pure) and context (on disk), smoke (the host side of stage 5), pipeline (build, top to
bottom), rebuild (CI), bump (bases along base.follow), pins (`imgbuild lock`), attest (provenance, SBOM, signing)."""
