// The Jinja renderer against what Python's Jinja 2 (as transformers configures it: trim_blocks,
// lstrip_blocks, loop controls, json.dumps for tojson) renders for the same templates.
#include <doctest/doctest.h>

#include <string>

#include "edge/backend/tokenizer/jinja.h"
#include "tokenizer_fixtures.h"

namespace {

namespace jinja = edge::backend::jinja;

jinja::value context(std::string_view json) {
  auto v = jinja::value::from_json(json);
  REQUIRE(v.ok());
  return *v;
}

std::string render(std::string_view source, std::string_view json = "{}") {
  auto program = jinja::parse_template(source);
  REQUIRE_MESSAGE(program.ok(), program.error().message());
  auto text = jinja::render(*program, context(json));
  REQUIRE_MESSAGE(text.ok(), text.error().message());
  return text->text;
}

// The rendering with its markup in brackets, `x` being "<c>": ordinary text from the globals.
std::string marked(std::string_view source) {
  auto program = jinja::parse_template(source);
  REQUIRE_MESSAGE(program.ok(), program.error().message());
  auto text = jinja::render(*program, context(R"({"x": "<c>", "xs": ["<c>", "<d>"]})"));
  REQUIRE_MESSAGE(text.ok(), text.error().message());
  return edge::testing::bracket_markup(*text);
}

std::string render_error(std::string_view source, std::string_view json = "{}", jinja::render_options options = {}) {
  auto program = jinja::parse_template(source);
  REQUIRE_MESSAGE(program.ok(), program.error().message());
  auto text = jinja::render(*program, context(json), options);
  REQUIRE(!text.ok());
  return text.error().message();
}

std::string parse_error(std::string_view source) {
  auto program = jinja::parse_template(source);
  REQUIRE(!program.ok());
  return program.error().message();
}

}  // namespace

TEST_CASE("jinja: text, expressions and whitespace control as transformers configures it") {
  CHECK(render("Hello {{ name }}!", R"({"name":"World"})") == "Hello World!");
  CHECK(render("a\n") == "a");                  // one trailing newline is dropped
  CHECK(render("a\n\n") == "a\n");
  CHECK(render("a\r\nb") == "a\nb");            // line breaks become \n
  CHECK(render("{% if true %}\nyes\n{% endif %}\nafter") == "yes\nafter");  // trim_blocks
  CHECK(render("  {% if true %}x{% endif %}") == "x");                        // lstrip_blocks
  CHECK(render("a  {% if true %}x{% endif %}") == "a  x");                    // not at a line's start
  CHECK(render("  {{ 'x' }}") == "  x");                                     // not for expressions
  CHECK(render("a   {{- 'b' -}}   c") == "abc");
  CHECK(render("a\n  {%- if true -%}\n  b  {%- endif %}") == "ab");
  CHECK(render("  {%+ if true %}x{% endif %}") == "  x");
  CHECK(render("{% if true +%}\nx{% endif %}") == "\nx");
  CHECK(render("{# a comment #}\nx") == "x");
  CHECK(render("a {#- c -#} b") == "ab");
  CHECK(render("{% raw %}{{ not rendered }}{% endraw %}") == "{{ not rendered }}");
  CHECK(render("{{ {'a': {'b': 1}} }}") == "{'a': {'b': 1}}");
  CHECK(render("{% generation %}x{% endgeneration %}") == "x");
}

TEST_CASE("jinja: literals and Python's str() of values") {
  CHECK(render("{{ 1 }} {{ 1.0 }} {{ 0.1 }} {{ 1e-5 }} {{ 1e16 }} {{ 2.5e-3 }}") == "1 1.0 0.1 1e-05 1e+16 0.0025");
  CHECK(render("{{ none }} {{ None }} {{ true }} {{ False }}") == "None None True False");
  CHECK(render("{{ [1, 'a', none, [true]] }}") == "[1, 'a', None, [True]]");
  CHECK(render("{{ (1,) }} {{ (1, 2) }} {{ () }}") == "(1,) (1, 2) ()");
  CHECK(render(R"({{ "it's" }} {{ ["it's", 'say "hi"', 'a\nb'] }})") == "it's [\"it's\", 'say \"hi\"', 'a\\nb']");
  CHECK(render("{{ 'a' 'b' }}") == "ab");
  CHECK(render(R"({{ '\u00e9\x41\t' }})") == "\xC3\xA9" "A\t");
  CHECK(render("{{ undefined_name }}|") == "|");
}

TEST_CASE("jinja: arithmetic, comparisons and logic as in Python") {
  CHECK(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}") ==
        "3 -4 1 2 3.5 1024 0.5");
  CHECK(render("{{ 1 + 2.0 }} {{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1 ~ 'x' ~ none }}") ==
        "3.0 ab ababab [1, 2] 1xNone");
  CHECK(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ 'a' < 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}") ==
        "True True True True True False");
  CHECK(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}") == "True True True True");
  CHECK(render("{{ 0 or 'x' }} {{ '' and 'y' }} {{ not [] }} {{ 1 if false }}|{{ 'a' if true else 'b' }}") == "x  True |a");
  CHECK(render("{{ -1 | abs }} {{ - 2 ** 2 }}") == "1 4");
  CHECK(render_error("{{ 1 + 'a' }}") == "line 1: unsupported operand type(s) for +: 'int' and 'str'");
  CHECK(render_error("{{ 1 // 0 }}") == "line 1: integer division or modulo by zero");
}

TEST_CASE("jinja: attribute and item access, slices, Undefined") {
  const std::string data = R"({"m": {"role": "user", "content": "hi", "items": 3}, "l": [1, 2, 3, 4, 5], "s": "héllo"})";
  CHECK(render("{{ m.role }} {{ m['content'] }} {{ m.missing }}| {{ l[0] }} {{ l[-1] }} {{ l.1 }}", data) ==
        "user hi | 1 5 2");
  CHECK(render("{{ l[1:3] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ s[1:3] }} {{ s[::-1] }}", data) ==
        "[2, 3] [5, 4, 3, 2, 1] [1, 3, 5] [4, 5] él olléh");
  CHECK(render("{{ m['items'] }}", data) == "3");
  CHECK(render("{{ m.missing is defined }} {{ m.role is defined }} {{ nope is undefined }}", data) == "False True True");
  CHECK(render_error("{{ nope.attr }}") == "line 1: 'nope' is undefined");
  CHECK(render_error("\n\n{{ m.missing.x }}", data) == "line 3: 'dict object' has no attribute 'missing'");
  CHECK(render("{{ nope | length }} {% for x in nope %}x{% endfor %}{{ nope ~ 'a' }}") == "0 a");
  CHECK(render("{{ none.x }}|") == "|");
}

TEST_CASE("jinja: for loops") {
  CHECK(render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
               "{{ loop.last }}{{ loop.length }},{% endfor %}") ==
        "103TrueFalse3,212FalseFalse3,321FalseTrue3,");
  CHECK(render("{% for x in [1, 2, 3] %}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}") == "2|13|2|");
  CHECK(render("{% for x in [] %}x{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for x in range(10) if x is odd %}{{ x }}{% endfor %}") == "13579");
  CHECK(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}") == "a=1;b=2;");
  CHECK(render("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}") == "ab");
  CHECK(render("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}"
               "{{ x }}{% endfor %}") == "02");
  CHECK(render("{% for x in 'ab' %}{{ loop.cycle('odd', 'even') }}{% endfor %}") == "oddeven");
  CHECK(render("{% set x = 0 %}{% for i in range(3) %}{% set x = i %}{% endfor %}{{ x }}") == "0");
}

TEST_CASE("jinja: set, namespace, macros, call blocks, filter blocks") {
  CHECK(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}") == "12");
  CHECK(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}") == "6");
  CHECK(render("{% set t %}in {{ 1 }}{% endset %}[{{ t }}]") == "[in 1]");
  CHECK(render("{% set t | upper %}abc{% endset %}{{ t }}") == "ABC");
  CHECK(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }}") ==
        "Hi A! Hi B?");
  CHECK(render("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body{% endcall %}") == "<body>");
  CHECK(render("{% filter upper %}shout{% endfilter %}") == "SHOUT");
  CHECK(render("{% with a = 5 %}{{ a }}{% endwith %}{{ a }}|") == "5|");
  CHECK(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}") == "321");
}

TEST_CASE("jinja: filters") {
  CHECK(render("{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}") ==
        "a b|a|Hello World|Hello");
  CHECK(render("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [1, 2] | reverse | list }} {{ [1, 1, 2] | unique | list }}") ==
        "[1, 2, 3] ['A', 'b', 'c'] [2, 1] [1, 2]");
  CHECK(render("{{ [1, 2, 3] | join(', ') }} {{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | length }} {{ {'a': 1} | count }}") ==
        "1, 2, 3 1 3 3 1");
  CHECK(render("{{ x | default('d') }} {{ '' | default('e', true) }} {{ x | d('f') }}") == "d e f");
  CHECK(render(R"({{ [{'n': 'a', 'k': 1}, {'n': 'b', 'k': 0}] | selectattr('k') | map(attribute='n') | list }})") == "['a']");
  CHECK(render(R"({{ [{'n': 'a', 'k': 1}, {'n': 'b', 'k': 0}] | rejectattr('k', 'equalto', 1) | map(attribute='n') | join }})") == "b");
  CHECK(render("{{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3] | reject('odd') | list }} {{ ['a', 'b'] | map('upper') | list }}") ==
        "[2, 4] [2] ['A', 'B']");
  CHECK(render("{{ {'b': 1, 'a': 2} | dictsort }} {{ {'a': 1} | items | list }}") == "[('a', 2), ('b', 1)] [('a', 1)]");
  CHECK(render("{{ 'a-b' | replace('-', '+') }} {{ 42 | string }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }} {{ 2.6 | round }} {{ 2.5 | round }}") ==
        "a+b 42 43 0 2.5 3.0 2.0");
  CHECK(render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}") == "a\n  b\n\n  c|  a\n  b");
  CHECK(render("{{ '<a&b>' | e }} {{ 'x' | safe }} {{ [1, 2, 3, 4, 5] | batch(2) | list }}") == "&lt;a&amp;b&gt; x [[1, 2], [3, 4], [5]]");
  CHECK(render("{{ '%s-%d' | format('a', 3) }} {{ '%.2f' % 3.14159 }} {{ [1, 2] | sum }} {{ [3, 1] | max }} {{ [3, 1] | min }}") ==
        "a-3 3.14 3 3 1");
}

TEST_CASE("jinja: tojson is Python's json.dumps(ensure_ascii=False)") {
  const std::string data = R"({"t": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Zürich \"or\" <Paris>\n"}}, "required": ["city"]}, "n": 1.5, "i": 2, "z": null, "b": true, "e": [], "o": {}}})";
  CHECK(render("{{ t | tojson }}", data) ==
        R"({"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Zürich \"or\" <Paris>\n"}}, "required": ["city"]}, "n": 1.5, "i": 2, "z": null, "b": true, "e": [], "o": {}})");
  CHECK(render("{{ {'a': [1, 2], 'b': {}} | tojson(indent=2) }}") == "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}");
  CHECK(render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ 'é' | tojson(ensure_ascii=true) }} {{ '\\b\\f\x7f' | tojson }}") ==
        "{\"a\": 2, \"b\": 1} \"\\u00e9\" \"\\b\\f\x7f\"");
  CHECK(render("{{ {'a': 1} | tojson(separators=(',', ':')) }}") == "{\"a\":1}");
  CHECK(render_error("{{ nope | tojson }}") == "line 1: Object of type Undefined is not JSON serializable");
}

TEST_CASE("jinja: tests") {
  CHECK(render("{{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} "
               "{{ {} is mapping }} {{ [] is sequence }} {{ 'a' is iterable }} {{ none is none }} {{ true is boolean }}") ==
        "True True True False True True True True True True");
  CHECK(render("{{ 4 is divisibleby 2 }} {{ 3 is odd }} {{ 1 is eq 1 }} {{ 1 is equalto(2) }} {{ false is false }} "
               "{{ 'ab' is lower }} {{ 2 is in [1, 2] }} {{ x is not defined }}") ==
        "True True True False True True True True");
}

TEST_CASE("jinja: string, list and dict methods") {
  CHECK(render("{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nab\\n'.lstrip('\\n') }}|{{ 'ab  '.rstrip() }}") == "x|a|ab\n|ab");
  CHECK(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }}") ==
        "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c']");
  CHECK(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aXa'.replace('a', 'b') }} {{ 'ab'.upper() }}") ==
        "True True bXb AB");
  CHECK(render("{{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }} {{ 'x {} {name}'.format(1, name='y') }}") ==
        "2 2 a-b x 1 y");
  CHECK(render("{% set l = [1] %}{% set _ = l.append(2) %}{{ l }} {{ l.pop() }} {{ l }}") == "[1, 2] 2 [1]");
  CHECK(render("{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b', 'z') }} {{ {'a': 1}.keys() | list }} {{ {'a': 1}.values() | list }}") ==
        "1 z ['a'] [1]");
  CHECK(render("{{ 'ß'.upper() }} {{ 'ÉCOLE'.lower() }} {{ 'hello world'.title() }}") == "SS école Hello World");
}

TEST_CASE("jinja: globals") {
  CHECK(render("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(3, 0, -1) | list }}") == "[0, 1, 2] [1, 3, 5] [3, 2, 1]");
  CHECK(render("{{ dict(a=1, b='x') }} {% set j = joiner('|') %}{% for x in [1, 2] %}{{ j() }}{{ x }}{% endfor %}") ==
        "{'a': 1, 'b': 'x'} 1|2");
  CHECK(render_error("line1\n{{ raise_exception('Roles must alternate') }}") == "line 2: Roles must alternate");
  jinja::render_options fixed;
  fixed.now = [] { return std::chrono::system_clock::from_time_t(0) + std::chrono::hours(24 * 365); };
  auto program = jinja::parse_template("{{ strftime_now('%Y') }}");
  REQUIRE(program.ok());
  const auto year = jinja::render(*program, context("{}"), fixed);
  REQUIRE(year.ok());
  CHECK((year->text == "1970" || year->text == "1971"));
}

TEST_CASE("jinja: syntax errors name the line and column") {
  CHECK(parse_error("{% if x %}\n  {{ y") == "line 2, column 3: '}}' is missing");
  CHECK(parse_error("{% if x %}\n  {{ y }") == "line 2, column 8: unexpected '}'");
  CHECK(parse_error("a\n{% for x in y %}x") == "line 2, column 18: the template ends before 'endfor' or 'else'");
  CHECK(parse_error("{{ x | nofilter }}") == "line 1, column 8: no filter named 'nofilter'");
  CHECK(parse_error("{{ x is notatest }}") == "line 1, column 9: no test named 'notatest'");
  CHECK(parse_error("{% include 'x' %}") == "line 1, column 4: 'include' is not supported in chat templates");
  CHECK(parse_error("{% break %}") == "line 1, column 4: 'break' outside of a loop");
  CHECK(parse_error("{{ 'abc }}").starts_with("line 1, column 4: the string is not closed"));
  CHECK(parse_error("{{ (1 }}").starts_with("line 1, column 7: unexpected '}'"));
  CHECK(parse_error("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}").find("nests more than") !=
        std::string::npos);
}

TEST_CASE("jinja: renders are bounded") {
  jinja::render_options small;
  small.limits.max_output_bytes = 1000;
  CHECK(render_error("{% for i in range(100) %}0123456789abcdef{% endfor %}", "{}", small).find("would pass 1000 bytes") !=
        std::string::npos);
  CHECK(render_error("{{ 'x' * 100000 }}", "{}", small).find("would pass 1000 bytes") != std::string::npos);
  CHECK(render_error("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "{}",
                     small).find("would pass") != std::string::npos);
  jinja::render_options few;
  few.limits.max_steps = 10000;
  CHECK(render_error("{% for i in range(100000) %}{% endfor %}", "{}", few).find("steps") != std::string::npos);
  CHECK(render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("more than 1000 deep") != std::string::npos);
  CHECK(render_error("{% set ns = namespace() %}{% set ns.me = [ns] %}").find("cannot hold itself") != std::string::npos);
}

TEST_CASE("jinja: the template's text and literals are markup, the globals' strings are not") {
  CHECK(marked("<a>{{ x }}|{% if true %}<t>{% endif %}") == "[<a>]<c>[|<t>]");
  CHECK(marked("{{ '<a>' ~ x ~ '<b>' }} {{ '<a>' + x }}") == "[<a>]<c>[<b> <a>]<c>");
  CHECK(marked("{{ x }}{{ xs[1] }}{{ xs | join('') }}") == "<c><d><c><d>");
  auto program = jinja::parse_template("{{ role }}: {{ x }}");
  REQUIRE(program.ok());
  auto globals = jinja::value::dict({{"role", jinja::value::markup("user")}, {"x", jinja::value("<c>")}});
  const auto text = jinja::render(*program, globals);
  REQUIRE(text.ok());
  CHECK(edge::testing::bracket_markup(*text) == "[user: ]<c>");
}

TEST_CASE("jinja: markup is kept where strings are cut, joined and formatted") {
  CHECK(marked("{{ ('  <a>' + x + '  ') | trim }}|{{ ('\n<a>' ~ x).strip() }}|{{ (x ~ '<a>\n').rstrip('\n') }}") ==
        "[<a>]<c>[|<a>]<c>[|]<c>[<a>]");
  CHECK(marked("{{ ('<a>|' ~ x).split('|')[0] }}/{{ ('<a>|' ~ x).split('|')[1] }}") == "[<a>/]<c>");
  CHECK(marked("{{ x.replace('c', '<z>') }} {{ ('<a>' ~ x) | replace('a', 'b') }}") == "<[<z>]>[ <b>]<c>");
  CHECK(marked("{{ ['<a>', x] | join('<s>') }} {{ '<s>'.join(xs) }}") == "[<a><s>]<c>[ ]<c>[<s>]<d>");
  CHECK(marked("{{ '<a>%s<b>' % x }} {{ '<a>{}<b>'.format(x) }} {{ '<a>%s' | format(x) }}") ==
        "[<a>]<c>[<b> <a>]<c>[<b> <a>]<c>");
  CHECK(marked("{{ ('<a>' ~ x)[1:] }} {{ ('<a>' ~ x)[0] }} {{ ('<a>' ~ x)[-3:] }}") == "[a>]<c>[ < ]<c>");
  CHECK(marked("{% for c in '<a>' ~ x %}{{ c }}{% endfor %}") == "[<a>]<c>");
  CHECK(marked("{% set y %}<a>{{ x }}{% endset %}{{ y }}{% macro m(v) %}<b>{{ v }}{% endmacro %}{{ m(x) }}") ==
        "[<a>]<c>[<b>]<c>");
  CHECK(marked("{% set ns = namespace(s='') %}{% set ns.s = ns.s + '<a>' + x %}{{ ns.s }}") == "[<a>]<c>");
  CHECK(marked("{{ '<a>' if x else '' }}{{ x | default('<d>') }}{{ y | default('<d>') }}") == "[<a>]<c>[<d>]");
}

TEST_CASE("jinja: a filter or method computes markup from markup alone") {
  CHECK(marked("{{ '<a>' | upper }} {{ '<a>' | center(5) }} {{ '<a>' | tojson }}") == "[<A>  <a>  \"<a>\"]");
  CHECK(marked("{{ x | upper }} {{ ('<a>' ~ x) | upper }} {{ ('<a>' ~ x)[::2] }}") == "<C>[ ]<A><C>[ ]<>c");
  // However the template moves a client's text, it stays text.
  CHECK(marked("{{ x | string }}{{ x | trim }}{{ x[0] }}{{ x.strip() }}{{ x | tojson }}{{ xs | first }}{{ x | list | join }}") ==
        "<c><c><<c>\"<c>\"<c><c>");
  CHECK(marked("{{ x | replace('c', x) }}{{ '%s' | format(x) }}{{ xs | map('upper') | join }}") == "<<c>><c><C><D>");
  // The template's own text put in stays its own, and makes no token with the client's beside it
  // (the tokenizer matches a markup token only wholly inside markup).
  CHECK(marked("{{ x | replace('<', '<|') }}") == "[<|]c>");
}
