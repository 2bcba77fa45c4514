"""imgbuild's smoke test, run inside an image: a package by check, copied into the image as a folder. Each module
depends on nothing but the stdlib, the image's framework and its siblings (relative imports), so the folder runs as
it is wherever it is copied.

Proves the framework is the base's own and works: CUDA visible and compiled for this GPU, cuDNN convolutions match
the CPU, tensor-core mixed precision is actually fast, AMP training converges, NCCL, torch.compile and FP8 where
they apply. Each check is pass / fail / skip / warn with its reason and numbers.

    python3 FOLDER [--framework pytorch|tensorflow] [--require-gpu] [--libraries-only] [--format json|table]

The JSON report is one line, after the marker its caller gives in IMGBUILD_PROBE_MARKER (report.MARKER_VARIABLE),
so logs before it cannot break parsing. `--libraries-only` runs what needs no GPU (framework, CUDA/cuDNN/NCCL
libraries against the image's declared versions) and reports the archs the framework was compiled for:
`imgbuild smoke --for` judges GPU models from that. Env: IMGBUILD_EXPECT_FRAMEWORK_VERSION (the base's version;
default: the image's PYTORCH_VERSION / TENSORFLOW_VERSION), IMGBUILD_SMOKE_MIN_SPEEDUP (override the
per-architecture floor), IMGBUILD_SMOKE_GPU_SECONDS (the GPU checks' budget).

Modules: report (outcomes, the report, children), main and runners (the command line, each framework's checks in
order), framework, libraries, pipcheck, imports (with dists, hints, importing), commands, cpu, cuda, arch, cudnn,
throughput, amp, budget, collectives, compiling, fp8, shm, sbom, versions.
"""
