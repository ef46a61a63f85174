// The parsed template: one node type for expressions and statements, each with where it was
// written. Built by the parser, read by the interpreter, never changed after parsing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "edge/backend/tokenizer/jinja.h"

namespace edge::backend::jinja {

enum class node_kind : std::uint8_t {
  // ---- expressions -----------------------------------------------------------------------
  literal,   // value
  name,      // text: the variable
  list,      // children: the items
  tuple,     // children: the items
  dict,      // children: key0, value0, key1, value1, ...
  getattr,   // children[0]: the object; text: the attribute (x.y)
  getitem,   // children[0]: the object, children[1]: the key (x[y])
  slice,     // children[0]: the object; children[1..3]: start, stop, step (null when not written)
  call,      // children[0]: the callee, children[1..]: positional arguments; keywords
  filter,    // children[0]: the operand (null in a filter block); text: the filter; children[1..]; keywords
  test,      // children[0]: the operand; text: the test; children[1..]: arguments; flag: `is not`
  negative,  // children[0]
  positive,  // children[0]
  logical_not,  // children[0]
  logical_and,  // children[0], children[1]
  logical_or,   // children[0], children[1]
  binary,       // op; children[0], children[1]
  compare,      // children: the operands; ops: the operators between them (a < b <= c)
  conditional,  // children[0]: value if true, children[1]: the condition, children[2]: else (may be null)
  // ---- statements --------------------------------------------------------------------------
  body,       // children: statements, rendered in order
  text,       // value: the text
  output,     // children[0]: the expression printed
  if_block,   // children[0]: condition, children[1]: body, children[2]: else body (may be null)
  for_block,  // names: the targets (several: unpacking); children[0]: iterable, [1]: filter (may be
              // null), [2]: body, [3]: else body (may be null); flag: the body uses `loop`
  set,        // children[0]: target (name, tuple of names, or getattr on a namespace), children[1]: value
  set_block,  // children[0]: target name; children[1]: body; children[2]: filter chain (may be null)
  macro,      // text: name; names: parameters; children[0..n-1]: their defaults (null: none); last: body
  call_block,   // children[0]: the call; names: caller's parameters; children[1..n]: defaults; last: body
  filter_block,  // children[0]: filter chain whose innermost operand is null; children[1]: body
  with_block,    // names: the variables; children[0..n-1]: their values; last: body
  break_loop,
  continue_loop,
};

enum class binary_op : std::uint8_t { add, sub, mul, div, floordiv, mod, pow, concat, eq, ne, lt, le, gt, ge, in, not_in };

struct node {
  node_kind kind = node_kind::literal;
  int line = 0;
  int column = 0;
  value literal;
  std::string text;
  binary_op op = binary_op::add;
  bool flag = false;
  std::vector<std::unique_ptr<node>> children;
  std::vector<std::pair<std::string, std::unique_ptr<node>>> keywords;
  std::vector<std::string> names;
  std::vector<binary_op> ops;
};

using node_ptr = std::unique_ptr<node>;

}  // namespace edge::backend::jinja
