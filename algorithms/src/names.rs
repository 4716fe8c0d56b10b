//! The `(variant, verl name)` tables of the option enums ([`crate::LossAggMode::ALL`],
//! [`crate::PolicyLossMode::ALL`]), looked up one way and the other. Each enum keeps its own
//! table, `Display` and `FromStr` (with its own error); this is only the lookup.

/// The name of `value` in `table` (empty when the table lacks it).
pub(crate) fn name_of<T: Copy + PartialEq>(table: &[(T, &'static str)], value: T) -> &'static str {
    table
        .iter()
        .find(|(v, _)| *v == value)
        .map(|(_, n)| *n)
        .unwrap_or("")
}

/// The variant named `name` in `table`.
pub(crate) fn named<T: Copy>(table: &[(T, &'static str)], name: &str) -> Option<T> {
    table.iter().find(|(_, n)| *n == name).map(|(v, _)| *v)
}
