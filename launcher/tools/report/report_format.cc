#include "launcher/tools/report/report_format.h"

#include <cstdio>

namespace railshard::report {

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

std::string percent(double fraction) {
  if (fraction < 0) return "-";
  return fixed(fraction * 100, 1) + "%";
}

std::string rate(double value) {
  return fixed(value, value < 10 ? 3 : value < 1000 ? 2 : 0);
}

std::string rankKey(int rank) {
  // Appended rather than "r" + ...: GCC 12 warns (-Wrestrict, falsely) on literal + temporary.
  std::string key = "r";
  key += std::to_string(rank);
  return key;
}

}  // namespace railshard::report
