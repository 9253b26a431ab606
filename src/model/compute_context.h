// What every model component needs to run its kernels: the kernel tables (reference = the scalar oracle,
// or the fastest this CPU runs) and the worker threads. Owned by the caller (the model runner).
#pragma once

#include "kernels/linear.h"

namespace dsflash {

class ThreadPool;

struct ComputeContext {
  const LinearKernels* linear = nullptr;  // reference_linear_kernels() or best_linear_kernels()
  ThreadPool* pool = nullptr;             // nullptr: single-threaded
  bool reference = false;                 // true: every other kernel takes its scalar reference path too
};

}  // namespace dsflash
