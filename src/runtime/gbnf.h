// GBNF (llama.cpp's grammar format, docs/api.md "GBNF grammars") -> grammar (grammar.h), for the
// `grammar` field of llama.cpp's and vLLM's requests.
//
//   root ::= "yes" | "no"                    # rules: name ::= alternatives; '#' comments
//   list ::= ("- " [^\n]+ "\n"){1,5}         # groups, [classes], [^negated], . * + ? {m} {m,} {m,n}
//
// The syntax is llama.cpp's (tools/llamacpp/.../llama/grammars/README.md): rule names of letters,
// digits and '-' (and '_'); literals and classes of Unicode code points with the escapes \xHH
// \uHHHH \UHHHHHHHH \t \r \n \\ \" \[ \] \-; a rule ends at the end of its line unless the line
// ends with '|' or the newline is inside parentheses. Code points become their UTF-8 bytes: a
// class is the set of the well-formed UTF-8 encodings of its code points (surrogates excluded),
// so a grammar never lets a token produce ill-formed UTF-8.
//
// Refused with an error naming the line and column: syntax errors, undefined or duplicated rules,
// a missing root, left recursion (the matcher cannot run it; llama.cpp refuses it too), `*` / `+`
// / `{m,}` on an expression that can match the empty string, repetition counts above 2,000
// (llama.cpp's bound), nesting deeper than 128, grammars above 131,072 elements once repetitions
// are unrolled (a compiled grammar stays within a few MB), and llama.cpp's token matches (`<[id]>`, `<text>`,
// `!<...>`): this grammar is over bytes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "runtime/grammar.h"

namespace mr {

// The expression of rule `root` of the GBNF text, in `b`.
Result<GrammarBuilder::Expr> GbnfExpr(GrammarBuilder& b, std::string_view text, std::string_view root = "root");

// The expression of the strings a regular expression matches in full (vLLM's guided_regex):
// Python / ECMAScript syntax without what a grammar cannot express: alternation, groups ((...),
// (?:...), named), quantifiers (* + ? {m} {m,} {m,n} {,n}, lazy and possessive forms alike),
// classes ([...] [^...], \d \w \s and their negations, ASCII as in Python's re.ASCII), '.' (any
// character but a newline), escapes (\n \t \r \f \v \0 \xHH \uHHHH \UHHHHHHHH, escaped
// punctuation); '^' and '$' only where they anchor the whole pattern. Refused with the position:
// backreferences, lookaround, inline flags, other anchors (\b, \A, ...), and the bounds of GBNF.
Result<GrammarBuilder::Expr> RegexExpr(GrammarBuilder& b, std::string_view pattern);

// The bodies of the JSON strings (between the quotes, as JSON writers escape them: \" \\ \n \t \r
// \b \f, other control characters as \u00xx) whose text contains a match of `pattern`: JSON
// Schema's `pattern` (ECMAScript, unanchored: an alternative without '^' may have any text before
// its match, one without '$' any text after it). RegexExpr's syntax; '^' / '$' at the edges of a
// group inside the pattern are refused.
Result<GrammarBuilder::Expr> JsonPatternExpr(GrammarBuilder& b, std::string_view pattern);

// The GBNF of a choice among literal strings (vLLM's guided_choice): root ::= "a" | "b" ...
std::string GbnfChoice(const std::vector<std::string>& options);

// `s` as a GBNF string literal (quotes, backslashes and control bytes escaped).
std::string GbnfQuote(std::string_view s);

}  // namespace mr
