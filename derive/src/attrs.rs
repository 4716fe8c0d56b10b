//! What the derives read from attributes: doc comments, the serde attributes that change a key or
//! a choice's name (`rename`, `rename_all`, `default`, `skip`, `flatten`), and `#[param(...)]`.

use proc_macro2::{Span, TokenTree};
use syn::{Attribute, Expr, Lit, LitStr, Meta};

/// The doc comment of an item, one line: its non-empty lines trimmed and joined with spaces (a
/// long doc wraps over several `///` lines).
pub fn doc_of(attrs: &[Attribute]) -> String {
    let mut lines = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("doc")) {
        if let Meta::NameValue(nv) = &attr.meta
            && let Expr::Lit(lit) = &nv.value
            && let Lit::Str(s) = &lit.lit
        {
            for line in s.value().lines() {
                let line = line.trim();
                if !line.is_empty() {
                    lines.push(line.to_string());
                }
            }
        }
    }
    lines.join(" ")
}

/// serde's `rename_all` rules (serde_derive `internals/case.rs`), so that a key or a choice is
/// spelled as serde spells it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RenameRule {
    None,
    Lower,
    Upper,
    Pascal,
    Camel,
    Snake,
    ScreamingSnake,
    Kebab,
    ScreamingKebab,
}

impl RenameRule {
    pub fn from_name(s: &LitStr) -> syn::Result<Self> {
        Ok(match s.value().as_str() {
            "lowercase" => RenameRule::Lower,
            "UPPERCASE" => RenameRule::Upper,
            "PascalCase" => RenameRule::Pascal,
            "camelCase" => RenameRule::Camel,
            "snake_case" => RenameRule::Snake,
            "SCREAMING_SNAKE_CASE" => RenameRule::ScreamingSnake,
            "kebab-case" => RenameRule::Kebab,
            "SCREAMING-KEBAB-CASE" => RenameRule::ScreamingKebab,
            other => {
                return Err(syn::Error::new(
                    s.span(),
                    format!("unknown rename rule `{other}`"),
                ));
            }
        })
    }

    /// A variant name (`PascalCase` in the source) under this rule.
    pub fn variant(self, v: &str) -> String {
        match self {
            RenameRule::None | RenameRule::Pascal => v.to_string(),
            RenameRule::Lower => v.to_ascii_lowercase(),
            RenameRule::Upper => v.to_ascii_uppercase(),
            RenameRule::Camel => v[..1].to_ascii_lowercase() + &v[1..],
            RenameRule::Snake => {
                let mut s = String::new();
                for (i, ch) in v.char_indices() {
                    if i > 0 && ch.is_uppercase() {
                        s.push('_');
                    }
                    s.push(ch.to_ascii_lowercase());
                }
                s
            }
            RenameRule::ScreamingSnake => RenameRule::Snake.variant(v).to_ascii_uppercase(),
            RenameRule::Kebab => RenameRule::Snake.variant(v).replace('_', "-"),
            RenameRule::ScreamingKebab => RenameRule::ScreamingSnake.variant(v).replace('_', "-"),
        }
    }

    /// A field name (`snake_case` in the source) under this rule.
    pub fn field(self, f: &str) -> String {
        match self {
            RenameRule::None | RenameRule::Lower | RenameRule::Snake => f.to_string(),
            RenameRule::Upper | RenameRule::ScreamingSnake => f.to_ascii_uppercase(),
            RenameRule::Pascal => {
                let mut s = String::new();
                let mut capitalize = true;
                for ch in f.chars() {
                    if ch == '_' {
                        capitalize = true;
                    } else if capitalize {
                        s.push(ch.to_ascii_uppercase());
                        capitalize = false;
                    } else {
                        s.push(ch);
                    }
                }
                s
            }
            RenameRule::Camel => {
                let p = RenameRule::Pascal.field(f);
                p[..1].to_ascii_lowercase() + &p[1..]
            }
            RenameRule::Kebab => f.replace('_', "-"),
            RenameRule::ScreamingKebab => f.to_ascii_uppercase().replace('_', "-"),
        }
    }
}

/// The serde attributes the derives honour; every other serde attribute is left to serde.
#[derive(Default)]
pub struct Serde {
    /// `rename = "..."` (or the `deserialize` name of `rename(...)`).
    pub rename: Option<String>,
    /// `rename_all = "..."` on the container.
    pub rename_all: Option<RenameRule>,
    /// `default` or `default = "path"`: serde fills the field when the key is absent.
    pub default: bool,
    /// `skip` / `skip_deserializing`: not a key at all.
    pub skip: bool,
    pub flatten: bool,
}

/// Skips the value of a serde attribute this crate does not read (`= value` or `(...)`).
fn skip_value(meta: &syn::meta::ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        let _: Expr = meta.value()?.parse()?;
    } else if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
        let _: TokenTree = meta.input.parse()?;
    }
    Ok(())
}

pub fn serde_of(attrs: &[Attribute]) -> syn::Result<Serde> {
    let mut out = Serde::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename") {
                if meta.input.peek(syn::Token![=]) {
                    out.rename = Some(meta.value()?.parse::<LitStr>()?.value());
                } else {
                    meta.parse_nested_meta(|inner| {
                        if inner.path.is_ident("deserialize") {
                            out.rename = Some(inner.value()?.parse::<LitStr>()?.value());
                            Ok(())
                        } else {
                            skip_value(&inner)
                        }
                    })?;
                }
            } else if meta.path.is_ident("rename_all") {
                if meta.input.peek(syn::Token![=]) {
                    let s: LitStr = meta.value()?.parse()?;
                    out.rename_all = Some(RenameRule::from_name(&s)?);
                } else {
                    meta.parse_nested_meta(|inner| {
                        if inner.path.is_ident("deserialize") {
                            let s: LitStr = inner.value()?.parse()?;
                            out.rename_all = Some(RenameRule::from_name(&s)?);
                            Ok(())
                        } else {
                            skip_value(&inner)
                        }
                    })?;
                }
            } else if meta.path.is_ident("default") {
                out.default = true;
                skip_value(&meta)?;
            } else if meta.path.is_ident("skip") || meta.path.is_ident("skip_deserializing") {
                out.skip = true;
            } else if meta.path.is_ident("flatten") {
                out.flatten = true;
            } else {
                skip_value(&meta)?;
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// `#[param(...)]` on a field: the [`ParamSpec`] builder calls, by the same names.
#[derive(Default)]
pub struct Param {
    pub default: Option<Expr>,
    pub min: Option<Expr>,
    pub max: Option<Expr>,
    pub gt: Option<Expr>,
    pub lt: Option<Expr>,
    pub required: bool,
    pub switch: bool,
    /// `resource = "model"`: the name of a declared resource of this resource kind.
    pub resource: Option<Expr>,
    /// `one_of = <&[&str]>`: string choices not given by a `ParamChoice` enum.
    pub one_of: Option<Expr>,
    /// `specs = <Vec<ParamSpec>>`: the specs of a flattened field, instead of its type's.
    pub specs: Option<Expr>,
    pub span: Option<Span>,
}

const PARAM_KEYS: &str = "default, min, max, gt, lt, required, switch, resource, one_of, specs";

pub fn param_of(attrs: &[Attribute]) -> syn::Result<Param> {
    let mut out = Param::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("param")) {
        out.span
            .get_or_insert(attr.path().get_ident().unwrap().span());
        attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            let slot = match key.as_str() {
                "default" => &mut out.default,
                "min" => &mut out.min,
                "max" => &mut out.max,
                "gt" => &mut out.gt,
                "lt" => &mut out.lt,
                "resource" => &mut out.resource,
                "one_of" => &mut out.one_of,
                "specs" => &mut out.specs,
                "required" => {
                    out.required = true;
                    return Ok(());
                }
                "switch" => {
                    out.switch = true;
                    return Ok(());
                }
                "ge" | "le" => {
                    let builder = if key == "ge" { "min" } else { "max" };
                    return Err(meta.error(format!(
                        "`{key}` is `{builder}` here (ParamSpec::{builder}, an inclusive bound)"
                    )));
                }
                _ => {
                    return Err(meta.error(format!(
                        "unknown `param` attribute `{key}`; expected one of {PARAM_KEYS}"
                    )));
                }
            };
            if slot.is_some() {
                return Err(meta.error(format!("`{key}` is given twice")));
            }
            *slot = Some(meta.value()?.parse()?);
            Ok(())
        })?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_rules_follow_serde() {
        assert_eq!(RenameRule::Snake.variant("TokenMean"), "token_mean");
        assert_eq!(
            RenameRule::Kebab.variant("SeqMeanTokenSum"),
            "seq-mean-token-sum"
        );
        assert_eq!(RenameRule::Lower.variant("LowVarKl"), "lowvarkl");
        assert_eq!(RenameRule::ScreamingSnake.variant("K3"), "K3");
        assert_eq!(RenameRule::Camel.variant("ClipCov"), "clipCov");
        assert_eq!(RenameRule::Kebab.field("clip_ratio_low"), "clip-ratio-low");
        assert_eq!(RenameRule::Camel.field("clip_ratio_low"), "clipRatioLow");
        assert_eq!(RenameRule::Pascal.field("norm_by_std"), "NormByStd");
    }

    #[test]
    fn doc_comments_become_one_line() {
        let item: syn::ItemStruct = syn::parse_quote! {
            /// divide by the group std
            /// (verl norm_adv_by_std_in_grpo)
            ///
            struct S;
        };
        assert_eq!(
            doc_of(&item.attrs),
            "divide by the group std (verl norm_adv_by_std_in_grpo)"
        );
    }
}
