// The median of a sample, the one definition the sync code uses.  Internal
// to libperfq.
#pragma once

#include <algorithm>
#include <vector>

namespace perfq {

// The median of v (the mean of the two middle values for an even count; 0
// when empty), reordering v.
inline long double median_in_place(std::vector<long double>& v) {
  if (v.empty()) return 0;
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m), v.end());
  const long double hi = v[m];
  if (v.size() % 2 == 1) return hi;
  const long double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m));
  return (lo + hi) / 2;
}

}  // namespace perfq
