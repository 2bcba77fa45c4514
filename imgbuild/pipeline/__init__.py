"""Stages 2, 3 and 5 and the build that runs them: plan (pure), resolve (the plan's edge: registry, local images,
the base's pins), render (pure) and context (on disk), record (`imgbuild.lock.json`), smoke (the host side of
stage 5), build (top to bottom), spared (a build not needed), pins (`imgbuild lock`), starter (`imgbuild init`)."""
