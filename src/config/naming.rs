//! How configuration errors name an activity's fields: by the id an SRE wrote
//! (`activities[id=1001].stock`; an index shifts when activities are added or reordered), by
//! index only while the id itself cannot be read. A leaf: every validating module names
//! activities through it.

/// Longest activity id; ids become part of Redis keys and metric labels.
pub const MAX_ACTIVITY_ID_LEN: usize = 64;

/// A character an activity id may hold.
pub(super) fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Whether an activity id is one the configuration accepts.
pub(super) fn readable_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ACTIVITY_ID_LEN && id.chars().all(is_id_char)
}

/// Whether a variant id is one the configuration accepts (and a buyer may name): 1 to
/// [`MAX_ACTIVITY_ID_LEN`] letters, digits, `-`, `_`, and `.` between them (half sizes:
/// `40.5`), never first, last or twice in a row (a path segment `.` or `..` is structure).
pub fn variant_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ACTIVITY_ID_LEN
        && id.chars().all(|c| is_id_char(c) || c == '.')
        && !id.starts_with('.')
        && !id.ends_with('.')
        && !id.contains("..")
}

/// The key of an activity's field in errors: `activities[id=1001].stock`.
pub fn activity_key(id: &str, field: &str) -> String {
    format!("activities[id={id}].{field}")
}

/// The key of the field of the activity at `index` whose id is `id`: by id when it can be
/// read, else by index.
pub(super) fn field_key(index: usize, id: &str, field: &str) -> String {
    match readable_id(id) {
        true => activity_key(id, field),
        false => format!("activities[{index}].{field}"),
    }
}
