// Text: Python's str semantics over UTF-8 std::string (code-point lengths and slices,
// strip/split/splitlines/case mapping with Python's notion of whitespace). Bytes that are
// not valid UTF-8 survive a decode/encode round trip unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::tokenizer::jinja {

void append_utf8(std::string& out, uint32_t cp);
std::vector<uint32_t> decode_utf8(const std::string& s);
std::string encode_utf8(const std::vector<uint32_t>& cps);
bool is_ascii(const std::string& s);
size_t codepoint_length(const std::string& s);

bool py_isspace(uint32_t cp);
// str.strip/lstrip/rstrip; `chars` absent means whitespace.
std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
// str.split / str.rsplit; `sep` absent splits on runs of whitespace.
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(const std::string& s, bool keepends = false);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);  // Python str.title()
std::string py_replace(const std::string& s, const std::string& old_s, const std::string& new_s, int64_t count);
int64_t py_count(const std::string& s, const std::string& sub);
int64_t py_find(const std::string& s, const std::string& sub, bool reverse);  // code-point index or -1
bool py_is_alnum_cp(uint32_t cp);
bool py_is_alpha_cp(uint32_t cp);
bool py_is_digit_cp(uint32_t cp);

}  // namespace strata::tokenizer::jinja
