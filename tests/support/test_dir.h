// A directory of the running test's own under the system's temporary directory, named by the
// process and the test, removed first so it starts empty (the caller creates what it needs).
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace strata::test {

inline std::filesystem::path fresh_test_dir(const std::string& prefix) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    (prefix + "_" + std::to_string(::getpid()) + "_" +
                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace strata::test
