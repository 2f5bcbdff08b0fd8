// What several subcommands share on the command line: the default trace
// file name.
#include <time.h>

#include <ctime>
#include <string>

#include "commands.h"

namespace perfqctl {

std::string default_trace_name() {
  const time_t now = ::time(nullptr);
  tm local{};
  ::localtime_r(&now, &local);
  char name[64];
  std::strftime(name, sizeof(name), "perfq-%Y%m%d-%H%M%S.trace", &local);
  return name;
}

}  // namespace perfqctl
