#pragma once
// RFC 8785 JSON Canonicalization Scheme (JCS), used to fingerprint JSON bodies so that a
// retry which re-serialises the same document differently is not a payload mismatch
// (SPEC §3.5).

#include <optional>
#include <string>
#include <string_view>

namespace onceproxy::core {

/// How number literals are written in the canonical form.
///
/// RFC 8785 writes every number as the ECMAScript form of its IEEE 754 double, which merges
/// distinct literals (9007199254740993 and 9007199254740992). SPEC §3.5 forbids two different
/// requests sharing a fingerprint, so some literals are written exactly as they appear in the
/// input instead; such a literal can never equal the canonical form of another number.
enum class number_form {
    /// RFC 8785, except that these literals are kept as written: an integer literal (no
    /// fraction, no exponent) whose value is not the value of its canonical form, a literal
    /// with more than 17 significant digits, and a literal outside the double range
    /// (overflow to infinity, or non-zero underflowing to zero). Matches every RFC 8785
    /// test vector; two literals of 16-17 significant digits may still merge.
    rfc8785,
    /// As rfc8785, and additionally every literal whose exact decimal value differs from the
    /// value of its canonical form is kept as written, so two numerically different literals
    /// never share a canonical form. `333333333.33333329` stays as written here. Used for
    /// fingerprints.
    distinct,
};

/// The canonical form of the JSON text `json`, or nullopt when it is not valid JSON (RFC
/// 8259 grammar, valid UTF-8, no duplicate member names, nesting at most 128 deep). Members
/// are sorted by the UTF-16 code units of their names, insignificant whitespace is removed,
/// strings use the minimal JCS escaping.
[[nodiscard]] std::optional<std::string> canonicalize_json(std::string_view json,
                                                           number_form form = number_form::rfc8785);

/// The same, written into `out` (its contents replaced, its capacity reused); false when `json`
/// is not valid JSON (`out` then holds a partial form).
[[nodiscard]] bool canonicalize_json_into(std::string_view json, number_form form,
                                          std::string& out);

} // namespace onceproxy::core
