// Device code of the common library: one kernel that uses both fetched dependencies.
#include <minidep/minidep.h>
#include <minidata.h>

__global__ void mini_scale_kernel(float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = data[i] * MINIDATA_SCALE + MINIDEP_MAGIC;
}

// Host side, called from the Python module: no GPU is touched.
extern "C" int mini_magic() { return MINIDEP_MAGIC * MINIDATA_SCALE; }
extern "C" const void* mini_kernel_address() { return reinterpret_cast<const void*>(&mini_scale_kernel); }
