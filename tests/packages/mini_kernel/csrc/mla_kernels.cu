// A FlashMLA-like kernel: an SM100 path for every __CUDA_ARCH__ >= 1000 and a Hopper path. Compiled for
// sm_120a, the tcgen05 instruction does not assemble ("not supported on .target 'sm_120a'").
__global__ void mla_kernel(float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
  out[threadIdx.x] = 3.0f;
}
extern "C" const void* mla_kernel_address() { return reinterpret_cast<const void*>(&mla_kernel); }
