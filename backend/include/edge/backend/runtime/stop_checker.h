// Stop strings that may span several tokens. Text is released only once it can no longer turn
// out to be the start of a stop string, so a client never sees part of one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace edge::backend {

class stop_checker {
 public:
  explicit stop_checker(std::vector<std::string> stops);

  struct step {
    std::string text;      // safe to release now
    bool stopped = false;  // a stop string ended the output; `text` ends right before it
    std::string matched;   // stopped: that stop string
  };

  // Takes newly decoded text.
  step push(std::string_view text);
  // The output ended for another reason: releases what was held back.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet released
};

}  // namespace edge::backend
