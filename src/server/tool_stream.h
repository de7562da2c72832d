// ToolCallStreamer: tool calls as incremental deltas while the model writes them, the way
// OpenAI streams them: a call's name as soon as it is complete, then its arguments in pieces.
// It reads the text ToolCallFilter holds back (everything from the first call marker on) and
// understands each format's call header (tool_parser.h); the arguments object is passed through
// with the whitespace outside strings dropped, which is how the parsed call prints it. Formats
// whose arguments are not JSON (Qwen3-Coder XML, Gemma 4) send each argument as JSON once it is
// complete, converted as the whole parse converts it (a Qwen3-Coder text value streams as it is
// written). The
// parse of the whole text at the end stays the authority: finish() sends what the stream has
// not shown yet of those calls (all of a call whose header had an unexpected shape).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_parser.h"

namespace strata::server {

struct ToolCallDelta {
  int index = 0;          // the call's position in the output, from 0
  bool first = false;     // the call's first delta: name is set, the client assigns the id
  std::string name;
  std::string arguments;  // the next piece of the arguments text
};

class ToolCallStreamer {
 public:
  explicit ToolCallStreamer(ToolCallFormat format, std::shared_ptr<const ToolParamTypes> types = nullptr)
      : format_(format), types_(std::move(types)) {}

  // The held-back call text so far (it only grows); returns the deltas it adds.
  std::vector<ToolCallDelta> update(std::string_view captured);
  // The calls parsed from the whole text; returns the deltas that complete them.
  std::vector<ToolCallDelta> finish(const std::vector<ToolCall>& calls);

 private:
  enum class State { kHeader, kArguments, kAfterCall, kWhole };
  // Reads a call header at or after cursor_; true when found (name_, cursor_ at the arguments).
  // Sets state_ kWhole when the text cannot be a header this streamer knows.
  bool read_header(std::string_view text);
  // kQwen3Coder, kGemma4: the arguments completed since cursor_, as JSON; *closed at the call's end.
  std::string read_pairs(std::string_view text, bool* closed);

  ToolCallFormat format_;
  std::shared_ptr<const ToolParamTypes> types_;  // kQwen3Coder: how its text values become JSON
  State state_ = State::kHeader;
  size_t cursor_ = 0;  // bytes of the captured text consumed
  std::string name_;
  // The arguments object being scanned.
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  size_t n_pairs_ = 0;  // arguments sent of the call being read (pair formats)
  // kQwen3Coder: a text parameter whose value streams as it is written.
  bool value_open_ = false;
  std::string value_key_;
  size_t value_sent_ = 0;  // the captured text's bytes of the value sent so far end here
  bool list_ = false;   // kMistral: the calls are one JSON list
  std::vector<std::string> streamed_;  // per call started: the arguments text sent
  std::vector<std::string> names_;     // per call started: its name
};

}  // namespace strata::server
