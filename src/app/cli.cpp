#include "app/cli.h"

#include <algorithm>
#include <cstdio>

namespace mr::app {

Cli::Cli(const std::string& name, const std::string& description) : name_(name), app_(description, "mererun " + name) {
  app_.option_defaults()->always_capture_default();
  app_.get_formatter()->column_width(40);
}

std::optional<int> Cli::Parse(const std::vector<std::string>& args) {
  // A single-valued option given twice keeps the last value (`--port 0 ... --port 8081`), as
  // most command lines do; list options (--allow-host, bench -m) accumulate.
  for (CLI::Option* opt : app_.get_options()) {
    if (opt->get_items_expected_max() == 1) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes from the back
  try {
    app_.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app_.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "mererun %s: %s\nRun `mererun %s --help` for the options.\n", name_.c_str(), e.what(),
                 name_.c_str());
    return kUsageError;
  }
  return std::nullopt;
}

CLI::Validator Positive() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not a valid number (want > 0)";
        if (!(v > 0)) return "must be > 0, got " + s;
        return "";
      },
      "> 0");
}

std::vector<std::string> NonEmpty(std::vector<std::string> items) {
  items.erase(std::remove(items.begin(), items.end(), std::string()), items.end());
  return items;
}

}  // namespace mr::app
