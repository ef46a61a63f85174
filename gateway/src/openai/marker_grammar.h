// Grammar pieces the output syntaxes share when an answer is constrained to them (tool_calls.h,
// reasoning.h): a marker as the vocabulary has it, and free text that cannot close a tag.
#pragma once

#include <string_view>

#include "edge/backend/grammar/grammar.h"
#include "edge/gateway/openai/output_events.h"

namespace edge::gateway {

// The marker as one special token where the vocabulary has it so (the model writes it that way,
// and a special token is never spelled out of plain ones), else as its bytes.
inline backend::grammar::expr marker_expr(std::string_view text, const special_token_test& is_special) {
  return is_special && is_special(text) ? backend::grammar::special_token(text) : backend::grammar::literal(text);
}

// Text without "</" anywhere: what a reasoning block may hold, so that no closing tag
// (</think>) ends it early, whether the model spells the tag out of
// plain tokens or not: ([^<] | '<'+ [^</])* '<'* (a run of '<' is followed by neither '/' nor,
// at the end, anything but the closing tag the caller puts there).
inline backend::grammar::expr text_without_closing_tag() {
  namespace g = backend::grammar;
  const g::expr angle = g::literal("<");
  const g::expr plain = g::char_class({{'<', '<'}}, /*negated=*/true);
  const g::expr after_angles = g::char_class({{'/', '/'}, {'<', '<'}}, /*negated=*/true);
  return g::seq({g::star(g::alt({plain, g::seq({g::plus(angle), after_angles})})), g::star(angle)});
}

}  // namespace edge::gateway
