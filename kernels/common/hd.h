// FLASHLAB_HD marks functions that both nvcc (host and device) and a plain host compiler build.
#pragma once

#ifdef __CUDACC__
#define FLASHLAB_HD __host__ __device__
#else
#define FLASHLAB_HD
#endif
