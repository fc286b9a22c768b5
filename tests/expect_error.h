#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace railshard::test {

// `error` is an `E` whose message contains `text`; `who` names the rank (or thread) in the
// failure messages. The one check behind every "this rank raised that" assertion.
template <typename E>
void expectError(const std::exception_ptr& error, const std::string& text, const std::string& who) {
  ASSERT_TRUE(error) << who << " finished without an error";
  try {
    std::rethrow_exception(error);
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << who << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << who << ": not the expected error type: " << e.what();
  }
}

}  // namespace railshard::test
