#pragma once

#include <string>

namespace railshard::report {

// Number formats shared by the text and HTML reports, so both print the same digits.

// `value` with `decimals` digits after the point.
std::string fixed(double value, int decimals);
// 0.8 -> "80.0%"; a negative value (unknown) -> "-".
std::string percent(double fraction);
// GB/s or Gbit/s: three decimals below 10, two below 1000, else none.
std::string rate(double value);
// "r<rank>", the name the dispatch counters give a rank's series.
std::string rankKey(int rank);

}  // namespace railshard::report
