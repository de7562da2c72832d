// strata tokenize: encode text to ids, or render a chat through the tokenizer's template.
//   strata tokenize --tokenizer DIR [--no-special] TEXT
//       prints the ids, space-separated, on one line
//   strata tokenize --tokenizer DIR --chat MESSAGES.json [--add-generation-prompt]
//                   [--kwargs JSON] [--template NAME]
//       prints the rendered prompt exactly, with no newline added
// MESSAGES.json holds a list of messages (or an object with "messages"); --kwargs is a JSON
// object (or @FILE) merged into the template context (tools, enable_thinking, ...).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/log.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

struct TokenizeArgs {
  std::string dir;
  std::string text;
  bool no_special = false;
  std::string chat_file;
  bool add_generation_prompt = false;
  std::string kwargs;
  std::string template_name = "default";
};

Result<std::string> read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(ErrorCode::kNotFound, std::string(what) + ": cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Key order matters: `tojson` in templates prints keys in the order the user wrote them.
using ojson = nlohmann::ordered_json;

Result<ojson> parse_json(const std::string& text, const std::string& what) {
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, what + ": invalid JSON: " + e.what());
  }
}

Result<std::string> render_chat(const tokenizer::Tokenizer& tok, const TokenizeArgs& args) {
  auto messages_text = read_file(args.chat_file, "--chat");
  if (!messages_text.ok()) return messages_text.error();
  auto messages = parse_json(*messages_text, "--chat " + args.chat_file);
  if (!messages.ok()) return messages.error();
  if (messages->is_object() && messages->contains("messages")) messages = ojson((*messages)["messages"]);
  if (!messages->is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "--chat " + args.chat_file + ": expected a list of messages");
  }
  ojson context = ojson::object();
  if (!args.kwargs.empty()) {
    std::string kwargs_text = args.kwargs;
    if (kwargs_text[0] == '@') {
      auto k = read_file(kwargs_text.substr(1), "--kwargs");
      if (!k.ok()) return k.error();
      kwargs_text = std::move(*k);
    }
    auto kwargs = parse_json(kwargs_text, "--kwargs");
    if (!kwargs.ok()) return kwargs.error();
    if (!kwargs->is_object()) return make_error(ErrorCode::kInvalidArgument, "--kwargs: expected a JSON object");
    context = std::move(*kwargs);
  }
  context["messages"] = std::move(*messages);
  context["add_generation_prompt"] = args.add_generation_prompt;
  if (!context.contains("bos_token") && !tok.bos_token().empty()) context["bos_token"] = tok.bos_token();
  if (!context.contains("eos_token") && !tok.eos_token().empty()) context["eos_token"] = tok.eos_token();

  auto source = tok.chat_template_source(args.template_name);
  if (!source.ok()) return make_error(source.error().code, args.dir + ": " + source.error().message);
  auto tmpl = tokenizer::ChatTemplate::parse(*source);
  if (!tmpl.ok()) return tmpl.error();
  return tmpl->render_ordered(context);
}

int run_tokenize(const TokenizeArgs& args) {
  auto tok = tokenizer::Tokenizer::load(args.dir);
  if (!tok.ok()) {
    log::error("{}", tok.error().to_string());
    return 1;
  }
  if (!args.chat_file.empty()) {
    if (!args.text.empty()) {
      log::error("give either TEXT or --chat, not both");
      return 2;
    }
    auto prompt = render_chat(*tok, args);
    if (!prompt.ok()) {
      log::error("{}", prompt.error().to_string());
      return 1;
    }
    std::fwrite(prompt->data(), 1, prompt->size(), stdout);
    return 0;
  }
  auto ids = tok->encode(args.text, !args.no_special);
  if (!ids.ok()) {
    log::error("{}", ids.error().to_string());
    return 1;
  }
  std::string line;
  for (size_t i = 0; i < ids->size(); ++i) {
    if (i) line.push_back(' ');
    line += std::to_string((*ids)[i]);
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text to ids, or render a chat with the tokenizer's template");
  cmd->add_option("--tokenizer", args->dir, "Directory with tokenizer.json and tokenizer_config.json")->required();
  cmd->add_flag("--no-special", args->no_special, "Do not add BOS/EOS and other post-processor tokens");
  cmd->add_option("--chat", args->chat_file, "JSON file with the messages to render");
  cmd->add_flag("--add-generation-prompt", args->add_generation_prompt, "End the rendered chat with the assistant prompt");
  cmd->add_option("--kwargs", args->kwargs, "JSON object (or @FILE) merged into the template context");
  cmd->add_option("--template", args->template_name, "Name of the chat template (default: default)");
  cmd->add_option("text", args->text, "Text to encode");
  cmd->callback([args] { exit_code() = run_tokenize(*args); });
}

}  // namespace strata::cli
