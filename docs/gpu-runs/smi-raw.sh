#!/bin/bash
# nvidia-smi's raw answers to the queries imgbuild's readers parse (gpu/read.py's GPU_QUERY, APP_QUERY and -L),
# written to $1 as test data; plan.sh and busy.sh both call it.
{
  echo "# nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,compute_cap,driver_version"
  nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,compute_cap,driver_version \
    --format=csv,noheader,nounits
  echo "# nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory"
  nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits
  echo "# nvidia-smi -L"
  nvidia-smi -L
} > "$1" 2>&1
