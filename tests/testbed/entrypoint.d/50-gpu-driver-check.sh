# No driver library or no device node: warn, export NVIDIA_CPU_ONLY=1, and go on (NGC does not fail).
_have_lib=""
if command -v ldconfig >/dev/null && ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then _have_lib=1; fi
if [ -z "$_have_lib" ]; then
  IFS=: read -ra _dirs <<< "${LD_LIBRARY_PATH:-}"
  for _d in "${_dirs[@]}"; do
    case "$_d" in *compat*) continue ;; esac
    [ -e "$_d/libcuda.so.1" ] && _have_lib=1
  done
fi
if [ -z "$_have_lib" ] || { [ ! -e /dev/nvidiactl ] && [ ! -e /dev/dxg ] && [ ! -e /dev/nvgpu ]; }; then
  echo "WARNING: The NVIDIA Driver was not detected.  GPU functionality will not be available."
  echo "   Use the NVIDIA Container Toolkit to start this container with GPU support; see"
  echo "   https://docs.nvidia.com/datacenter/cloud-native/ ."
  export NVIDIA_CPU_ONLY=1
fi
