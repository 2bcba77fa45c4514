_shm_kb=$(df -k /dev/shm 2>/dev/null | awk 'NR==2 {print $2}')
if [ -n "$_shm_kb" ] && [ "$_shm_kb" -le 65536 ]; then
  echo
  echo "NOTE: The SHMEM allocation limit is set to the default of 64MB.  This may be"
  echo "   insufficient for PyTorch.  NVIDIA recommends the use of the following flags:"
  echo "   docker run --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 ..."
fi
