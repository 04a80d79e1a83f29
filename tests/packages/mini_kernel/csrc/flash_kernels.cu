// Hopper-only kernel of the FA3-like library.
__global__ void flash_kernel(float* out) { out[threadIdx.x] = 2.0f; }
extern "C" const void* flash_kernel_address() { return reinterpret_cast<const void*>(&flash_kernel); }
