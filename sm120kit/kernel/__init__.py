"""Building sgl-kernel for sm_120a/sm_121a: source, third-party deps, build plan, build, nvcc launcher."""
