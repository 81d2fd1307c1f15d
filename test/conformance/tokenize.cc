// tessel's side of `./tessel conformance --tokenizers` (tokenizers.py):
// reads requests as JSON lines and answers each with one JSON line.
//   {"encode": TEXT, "add_special_tokens": true, "match_special_tokens": true}
//       -> {"ids": [...], "decoded": decode(ids)}
//   {"decode": [ids...]}  -> {"decoded": ...}
//   {"pretokenize": TEXT, "regex": "gpt2" | "llama3"} -> {"pieces": [...]} (pretokenize(), pretokenize_llama3())
//   an error              -> {"error": "..."}
// Decoded bytes that are not valid UTF-8 are written with U+FFFD (the
// comparison then fails unless `tokenizers` replaced the same bytes).
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "train/hf_tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"tessel's tokenizer.json encoder for the tokenizers conformance check"};
  std::string tokenizer_json, in_path, out_path;
  app.add_option("--tokenizer", tokenizer_json, "tokenizer.json")->required();
  app.add_option("--in", in_path, "requests, one JSON object a line")->required();
  app.add_option("--out", out_path, "answers, one JSON object a line")->required();
  CLI11_PARSE(app, argc, argv);
  using nlohmann::json;
  try {
    auto tok = tessel::train::HfTokenizer::load(tokenizer_json);
    std::ifstream in(in_path, std::ios::binary);
    std::ofstream out(out_path, std::ios::binary);
    if (!in || !out) {
      std::cerr << "tokenize: cannot open " << (!in ? in_path : out_path) << "\n";
      return 1;
    }
    std::string line;
    while (std::getline(in, line)) {
      const json req = json::parse(line);
      json ans;
      try {
        std::vector<int32_t> ids;
        if (req.contains("pretokenize")) {
          const std::string text = req["pretokenize"].get<std::string>();
          const bool llama3 = req.at("regex").get<std::string>() == "llama3";
          std::vector<std::string> pieces;
          for (auto p : llama3 ? tessel::train::pretokenize_llama3(text) : tessel::train::pretokenize(text))
            pieces.emplace_back(p);
          out << json{{"pieces", pieces}}.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
          continue;
        }
        if (req.contains("encode")) {
          tessel::train::HfEncodeOptions opt;
          opt.add_special_tokens = req.value("add_special_tokens", true);
          opt.match_special_tokens = req.value("match_special_tokens", true);
          ids = tok->encode(req["encode"].get<std::string>(), opt);
          ans["ids"] = ids;
        } else {
          ids = req["decode"].get<std::vector<int32_t>>();
        }
        ans["decoded"] = tok->decode(ids);
      } catch (const tessel::Error& e) {
        ans = json{{"error", e.what()}};
      }
      out << ans.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
  } catch (const tessel::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
