// The version of the JSON documents perfq prints and sends: every reply of
// perfq-daemon's control socket, every `--json` output of perfqctl and
// report_to_json() / report_compare_json().  Each carries it as the integer
// "schema_version", so that scripts can tell which fields they may expect.
// It goes up when a field changes its meaning or goes away; a new field
// leaves it as it is.
#pragma once

namespace perfq {

inline constexpr int kJsonSchemaVersion = 1;

}  // namespace perfq
