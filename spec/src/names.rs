//! Naming rules shared by every front end: names must be usable as Python dict keys,
//! Python identifiers and (after case conversion) Rust identifiers.

/// Python keywords and soft keywords; none may name a module.
const PYTHON_KEYWORDS: &[&str] = &[
    "false", "none", "true", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "match", "case", "type",
];

/// Rust keywords that cannot be raw identifiers or that a module name must avoid.
const RUST_KEYWORDS: &[&str] = &[
    "as", "break", "const", "continue", "crate", "else", "enum", "extern", "false", "fn", "for",
    "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return",
    "self", "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where",
    "while", "async", "await", "dyn", "abstract", "become", "box", "do", "final", "macro",
    "override", "priv", "typeof", "unsized", "virtual", "yield", "try", "gen",
];

/// `snake_case`: a lowercase letter, then lowercase letters, digits and single underscores.
pub fn is_snake_case(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    if !first.is_ascii_lowercase() || name.ends_with('_') || name.contains("__") {
        return false;
    }
    chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// What joins the names of a path in the spec: `constraint_feature.contact` is feature
/// `contact` of the featurizer's nested dict `constraint_feature`.
pub const PATH: &str = ".";

/// A feature name: `snake_case`, or a path of `snake_case` names joined by `.` (a
/// feature in a nested dict).
pub fn is_feature_name(name: &str) -> bool {
    name.split(PATH).all(is_snake_case)
}

/// Whether `name` is a Python or Rust keyword (not a usable module or field name).
pub fn is_keyword(name: &str) -> bool {
    PYTHON_KEYWORDS.contains(&name) || RUST_KEYWORDS.contains(&name)
}

/// Modules the generated Python imports (or imports from) by name: a generated module
/// named like one would shadow it for the code next to it.
const IMPORTED_MODULES: &[&str] = &[
    "builtins",
    "collections",
    "datetime",
    "json",
    "lightning",
    "math",
    "pathlib",
    "physicsnemo",
    "pytest",
    "pytorch_lightning",
    "sys",
    "torch",
    "typing",
];

/// Whether `name` would shadow a module the generated Python imports.
pub fn shadows_an_import(name: &str) -> bool {
    IMPORTED_MODULES.contains(&name)
}

/// A name whose UpperCamel form is a Rust keyword (`self` -> `Self`) cannot be an enum
/// variant of the generated tables.
pub fn camel_is_keyword(name: &str) -> bool {
    upper_camel(name) == "Self"
}

/// `atom_to_token` -> `AtomToToken`, the Rust enum variant of a feature or semantic
/// (`constraint_feature.contact` -> `ConstraintFeatureContact`).
pub fn upper_camel(name: &str) -> String {
    name.split(['_', '.'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// The closest of `candidates` to `name`, if any is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(name, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min()
        .map(|(_, c)| format!("did you mean `{c}`?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_case_accepts_feature_names_and_rejects_others() {
        assert!(is_snake_case("atom_to_token"));
        assert!(is_snake_case("ref_atom_name_chars"));
        assert!(!is_snake_case("Atom"));
        assert!(!is_snake_case("a__b"));
        assert!(!is_snake_case("a-b"));
        assert!(!is_snake_case("_a"));
        assert!(!is_snake_case(""));
    }

    #[test]
    fn camel_case_of_snake_names() {
        assert_eq!(upper_camel("atom_to_token"), "AtomToToken");
        assert_eq!(upper_camel("x"), "X");
    }
}
