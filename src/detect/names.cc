// Class names: Ultralytics' `names` metadata (a Python dict literal) and the COCO-80 default.
#include <cctype>
#include <map>

#include "absl/strings/numbers.h"
#include "vigil/detect/model_family.h"

namespace vigil::detect {
namespace {

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A recursive-descent reader of the Python literal subset Ultralytics writes.
class LiteralParser {
 public:
  explicit LiteralParser(std::string_view s) : s_(s) {}

  StatusOr<std::vector<std::string>> Parse() {
    SkipSpace();
    std::map<int64_t, std::string> names;
    const bool is_dict = Peek() == '{';
    if (!Consume(is_dict ? '{' : '[')) return Error("'{' or '['");
    const char close = is_dict ? '}' : ']';
    for (int64_t next = 0;; ++next) {
      SkipSpace();
      if (Consume(close)) break;
      int64_t key = next;
      if (is_dict) {
        VIGIL_ASSIGN_OR_RETURN(key, ParseInt());
        SkipSpace();
        if (!Consume(':')) return Error("':'");
        SkipSpace();
      }
      VIGIL_ASSIGN_OR_RETURN(std::string name, ParseString());
      if (key < 0 || key > 1'000'000) return Error("a class id in [0, 1000000]");
      names[key] = std::move(name);
      SkipSpace();
      if (Consume(close)) break;
      if (!Consume(',')) return Error(is_dict ? "',' or '}'" : "',' or ']'");
    }
    SkipSpace();
    if (pos_ != s_.size()) return Error("the end of the literal");
    std::vector<std::string> out(names.empty() ? 0 : names.rbegin()->first + 1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = StrCat("class", i);
    for (auto& [k, v] : names) out[k] = std::move(v);
    return out;
  }

 private:
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool Consume(char c) {
    if (pos_ >= s_.size() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  Status Error(std::string_view expected) const {
    return absl::InvalidArgumentError(StrCat("class names literal: expected ", expected, " at offset ", pos_));
  }

  StatusOr<int64_t> ParseInt() {
    const size_t start = pos_;
    if (Peek() == '-') ++pos_;
    while (std::isdigit(static_cast<unsigned char>(Peek()))) ++pos_;
    int64_t v = 0;
    if (!absl::SimpleAtoi(std::string(s_.substr(start, pos_ - start)), &v)) {
      pos_ = start;
      return Error("an integer key");
    }
    return v;
  }

  StatusOr<std::string> ParseString() {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error("a quoted string");
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) return Error("a closing quote");
      const char c = s_[pos_++];
      if (c == quote) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) return Error("an escaped character");
      const char e = s_[pos_++];
      switch (e) {
        case '\\': case '\'': case '"': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'x': case 'u': case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t i = 0; i < digits; ++i, ++pos_) {
            const char h = Peek();
            if (!std::isxdigit(static_cast<unsigned char>(h)) || cp > 0x10FFFF) {
              return Error(StrCat(digits, " hex digits (at most 10FFFF) after \\", e));
            }
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                                            : (h | 0x20) - 'a' + 10);
          }
          if (cp > 0x10FFFF) return Error("a code point at most 10FFFF");
          AppendUtf8(cp, out);
          break;
        }
        default: out += '\\'; out += e;  // Python keeps unknown escapes verbatim
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<std::vector<std::string>> ParseClassNames(std::string_view literal) {
  return LiteralParser(literal).Parse();
}

const std::vector<std::string>& CocoClassNames() {
  static const std::vector<std::string> kNames = {
      "person",        "bicycle",      "car",           "motorcycle",    "airplane",     "bus",
      "train",         "truck",        "boat",          "traffic light", "fire hydrant", "stop sign",
      "parking meter", "bench",        "bird",          "cat",           "dog",          "horse",
      "sheep",         "cow",          "elephant",      "bear",          "zebra",        "giraffe",
      "backpack",      "umbrella",     "handbag",       "tie",           "suitcase",     "frisbee",
      "skis",          "snowboard",    "sports ball",   "kite",          "baseball bat", "baseball glove",
      "skateboard",    "surfboard",    "tennis racket", "bottle",        "wine glass",   "cup",
      "fork",          "knife",        "spoon",         "bowl",          "banana",       "apple",
      "sandwich",      "orange",       "broccoli",      "carrot",        "hot dog",      "pizza",
      "donut",         "cake",         "chair",         "couch",         "potted plant", "bed",
      "dining table",  "toilet",       "tv",            "laptop",        "mouse",        "remote",
      "keyboard",      "cell phone",   "microwave",     "oven",          "toaster",      "sink",
      "refrigerator",  "book",         "clock",         "vase",          "scissors",     "teddy bear",
      "hair drier",    "toothbrush"};
  return kNames;
}

std::string ClassName(std::span<const std::string> names, int class_id) {
  if (class_id >= 0 && static_cast<size_t>(class_id) < names.size()) return names[class_id];
  return StrCat("class", class_id);
}

}  // namespace vigil::detect
