// Internal: the cross-bus job chain, by event name.  Host applications
// record job_submit and job_complete, the device job_start and job_end, all
// with the job's correlation id in arg (see perfq-devsim, perfq-demo-app).
// The report and every export recognize jobs through this one mapping.
#pragma once

#include <string_view>

namespace perfq {

enum JobRole : int { kNoRole = -1, kSubmit = 0, kStart = 1, kEnd = 2, kComplete = 3 };

inline JobRole job_role(std::string_view event_name) {
  if (event_name == "job_submit") return kSubmit;
  if (event_name == "job_start") return kStart;
  if (event_name == "job_end") return kEnd;
  if (event_name == "job_complete") return kComplete;
  return kNoRole;
}

}  // namespace perfq
