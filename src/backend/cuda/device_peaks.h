// The device's measured ceilings, for rooflines: copy bandwidth (a device-to-device
// cudaMemcpy of 4 GiB, bytes read + written per second) and the bf16 GEMM rate (cuBLASLt,
// 8192^3, f32 accumulate). Each is the median of 10 timed runs after 3 warm-ups.
#pragma once

#include "core/status.h"

namespace strata::cuda {

struct DevicePeaks {
  double bandwidth_bytes_s = 0.0;  // read + write
  double gemm_flops = 0.0;         // FLOP/s
};

// Takes about 12 GiB of device memory for the probes and frees it. Errors when no device is
// present or the memory is not there.
Result<DevicePeaks> measure_device_peaks();

}  // namespace strata::cuda
