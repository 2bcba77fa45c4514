case "${NVIDIA_PRODUCT_NAME:-}" in
  PyTorch) printf 'NVIDIA Release %s (build %s)\nPyTorch Version %s\n\n' "${NVIDIA_PYTORCH_VERSION:-}" "${NVIDIA_BUILD_ID:-}" "${PYTORCH_VERSION:-}" ;;
  TensorFlow) printf 'NVIDIA Release %s (build %s)\nTensorFlow Version %s\n\n' "${NVIDIA_TENSORFLOW_VERSION:-}" "${NVIDIA_BUILD_ID:-}" "${TENSORFLOW_VERSION:-}" ;;
esac
