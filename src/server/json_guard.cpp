#include "server/json_guard.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace strata::server {

namespace {

struct Frame {
  bool array = false;
  int64_t index = 0;    // arrays: the element being read
  std::string key;      // objects: the member being read
  bool want_key = true; // objects: the next string is a key
};

// messages[0].content[2] for the frames' current positions, at most `max_parts` of them.
std::string frame_path(const std::string& root, const std::vector<Frame>& frames, size_t max_parts) {
  std::string path;
  for (size_t i = 0; i < frames.size() && i < max_parts; ++i) {
    const Frame& f = frames[i];
    if (f.array) {
      path += (i == 0 ? root : "") + "[" + std::to_string(f.index) + "]";
    } else {
      path += (i == 0 ? "" : ".") + f.key;
    }
  }
  if (frames.size() > max_parts) path += "...";
  return path;
}

// The top-level field at fault: the body object's current key; `root` when the fault is the
// text itself (an array, a scalar, a container opened past the limit at the top).
std::string top_field(const std::string& root, const std::vector<Frame>& frames) {
  if (frames.empty() || frames[0].array || frames[0].key.empty()) return root;
  return frames[0].key;
}

template <class J>
std::optional<J> parse_bounded(std::string_view text, int max_depth, ApiError* error, const std::string& root) {
  if (auto e = check_json_text(text, max_depth, root)) {
    if (error) *error = std::move(*e);
    return std::nullopt;
  }
  J parsed = J::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    if (error) *error = bad_field(root, root + " is not valid JSON");
    return std::nullopt;
  }
  return parsed;
}

}  // namespace

std::optional<ApiError> check_json_text(std::string_view text, int max_depth, const std::string& root) {
  std::vector<Frame> frames;
  const size_t n = text.size();
  auto after_value = [&] {
    if (!frames.empty() && !frames.back().array) frames.back().want_key = true;
  };
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    switch (c) {
      case '[':
      case '{': {
        if (int(frames.size()) >= max_depth) {
          Frame open;
          open.array = c == '[';
          frames.push_back(open);
          return bad_field(top_field(root, frames),
                           "JSON nested deeper than " + std::to_string(max_depth) + " levels (--max-json-depth) at " +
                               frame_path(root, frames, 6) + " (byte offset " + std::to_string(i) + ")");
        }
        Frame f;
        f.array = c == '[';
        frames.push_back(std::move(f));
        break;
      }
      case ']':
      case '}':
        if (!frames.empty()) frames.pop_back();
        after_value();
        break;
      case ',':
        if (!frames.empty()) {
          if (frames.back().array) ++frames.back().index;
          else frames.back().want_key = true;
        }
        break;
      case ':':
        if (!frames.empty() && !frames.back().array) frames.back().want_key = false;
        break;
      case '"': {
        const size_t begin = i + 1;
        size_t j = begin;
        while (j < n && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
        if (!frames.empty() && !frames.back().array && frames.back().want_key) {
          // Keys are shown as written; an escaped key shows its escapes, which is enough to find it.
          frames.back().key = std::string(text.substr(begin, std::min(j, n) - begin));
          if (frames.back().key.size() > 64) frames.back().key = frames.back().key.substr(0, 64) + "...";
        }
        i = j;  // the closing quote (or the end)
        break;
      }
      case '-':
      case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': case '8': case '9': {
        size_t j = i;
        bool fractional = false;
        while (j < n && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '-' || text[j] == '+' ||
                         text[j] == '.' || text[j] == 'e' || text[j] == 'E')) {
          if (text[j] == '.' || text[j] == 'e' || text[j] == 'E') fractional = true;
          ++j;
        }
        // Integers past 64 bits become doubles in nlohmann; only a double's overflow is an error.
        if (fractional || j - i > 18) {
          const std::string token(text.substr(i, j - i));
          errno = 0;
          const double d = std::strtod(token.c_str(), nullptr);
          if (errno == ERANGE && std::isinf(d)) {
            std::string shown = token.size() > 40 ? token.substr(0, 37) + "..." : token;
            const std::string where = frames.empty() ? root : frame_path(root, frames, 6);
            return bad_field(top_field(root, frames), where + ": the number " + shown + " is out of range (beyond +-1.8e308)");
          }
        }
        i = j - 1;
        break;
      }
      default:
        break;
    }
  }
  return std::nullopt;
}

std::optional<nlohmann::json> parse_json_bounded(std::string_view text, int max_depth, ApiError* error,
                                                 const std::string& root) {
  return parse_bounded<nlohmann::json>(text, max_depth, error, root);
}

std::optional<nlohmann::ordered_json> parse_ordered_json_bounded(std::string_view text, int max_depth, ApiError* error,
                                                                 const std::string& root) {
  return parse_bounded<nlohmann::ordered_json>(text, max_depth, error, root);
}

}  // namespace strata::server
