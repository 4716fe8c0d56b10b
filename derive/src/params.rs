//! `#[derive(Params)]`: one `ParamSpec` per field of a serde struct.

use crate::attrs::{RenameRule, doc_of, param_of, serde_of};
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Error, Fields, Type};

/// Whether `ty` is written `Option<...>` (for fields whose type is overridden by `resource` or
/// `one_of`, which need not implement `ParamField`).
fn is_option(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none()
        && p.path.segments.last().is_some_and(|s| s.ident == "Option"))
}

pub fn expand(input: DeriveInput) -> syn::Result<TokenStream> {
    let name = &input.ident;
    if !input.generics.params.is_empty() {
        return Err(Error::new(
            input.generics.span(),
            "`Params` does not support generic structs",
        ));
    }
    let Data::Struct(data) = &input.data else {
        return Err(Error::new(
            name.span(),
            "`Params` derives a schema from a struct with named fields",
        ));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(Error::new(
            name.span(),
            "`Params` derives a schema from a struct with named fields",
        ));
    };
    let container = serde_of(&input.attrs)?;
    let rule = container.rename_all.unwrap_or(RenameRule::None);
    let engine = quote!(::flowrl_engine::params);

    let mut pushes = Vec::new();
    let mut checks = Vec::new();
    // Whether an absent table of this struct gets its fields' defaults (some field has one).
    let mut fills_defaults = false;
    for field in &fields.named {
        let ident = field.ident.as_ref().unwrap();
        let ty = &field.ty;
        let serde = serde_of(&field.attrs)?;
        let param = param_of(&field.attrs)?;
        let at = param.span.unwrap_or_else(|| ident.span());
        if serde.skip {
            continue;
        }
        if serde.flatten {
            fills_defaults = true;
            let specs = match &param.specs {
                Some(e) => quote!(#e),
                None => quote!(<#ty as #engine::ParamSchema>::param_specs()),
            };
            pushes.push(quote_spanned!(ty.span()=> specs.extend(#specs);));
            continue;
        }
        if param.specs.is_some() {
            return Err(Error::new(
                at,
                "`specs` gives the specs of a `#[serde(flatten)]` field",
            ));
        }
        let key = serde
            .rename
            .clone()
            .unwrap_or_else(|| rule.field(&ident.unraw().to_string()));
        let param_type = match (&param.resource, &param.one_of) {
            (Some(_), Some(_)) => {
                return Err(Error::new(at, "`resource` and `one_of` exclude each other"));
            }
            (Some(kind), None) => {
                quote!(#engine::ParamType::Resource(::std::string::String::from(#kind)))
            }
            (None, Some(choices)) => quote!(#engine::ParamType::Enum(
                (#choices).iter().map(|s| ::std::string::ToString::to_string(s)).collect()
            )),
            (None, None) => quote_spanned!(ty.span()=> <#ty as #engine::ParamField>::param_type()),
        };
        let overridden = param.resource.is_some() || param.one_of.is_some();
        let mut spec = quote!(#engine::ParamSpec::new(#key, #param_type));
        if let Some(d) = &param.default {
            spec = if overridden {
                quote!(#spec.default(#d))
            } else {
                quote!(#spec.default(<#ty as #engine::ParamField>::default_value(
                    ::std::convert::Into::<#engine::__derive::serde_json::Value>::into(#d)
                )))
            };
            fills_defaults = true;
        }
        if param.min.is_some() && param.gt.is_some() {
            return Err(Error::new(at, "`min` and `gt` both set the lower bound"));
        }
        if param.max.is_some() && param.lt.is_some() {
            return Err(Error::new(at, "`max` and `lt` both set the upper bound"));
        }
        for (method, v) in [
            ("min", &param.min),
            ("max", &param.max),
            ("gt", &param.gt),
            ("lt", &param.lt),
        ] {
            if let Some(v) = v {
                let m = syn::Ident::new(method, at);
                spec = quote!(#spec.#m(#v));
            }
        }
        if param.required {
            spec = quote!(#spec.required());
        }
        if param.switch {
            spec = quote!(#spec.switch());
            let msg = format!(
                "`{key}` is a `switch` table, absent when not written: its field must be an `Option`"
            );
            if !overridden {
                checks.push(quote_spanned!(at=> const _: () =
                    ::std::assert!(<#ty as #engine::ParamField>::OPTIONAL, #msg);));
            } else if !is_option(ty) {
                return Err(Error::new(ty.span(), msg));
            }
        }
        let doc = doc_of(&field.attrs);
        if !doc.is_empty() {
            spec = quote!(#spec.doc(#doc));
        }
        if param.default.is_none() && !param.required && !serde.default && !param.switch {
            let msg = format!(
                "parameter `{key}` needs `#[param(default = ...)]` or `#[param(required)]`, or an \
                 `Option` type: without them it is absent when not written, and the struct would \
                 not deserialize"
            );
            if !overridden {
                checks.push(quote_spanned!(ident.span()=> const _: () =
                    ::std::assert!(!<#ty as #engine::ParamField>::NEEDS_VALUE, #msg);));
            } else if !is_option(ty) {
                return Err(Error::new(ident.span(), msg));
            }
        }
        pushes.push(quote!(specs.push(#spec);));
    }

    let body = if pushes.is_empty() {
        quote!(::std::vec::Vec::new())
    } else {
        quote! {
            let mut specs = ::std::vec::Vec::new();
            #(#pushes)*
            specs
        }
    };
    Ok(quote! {
        impl #engine::ParamSchema for #name {
            fn param_specs() -> ::std::vec::Vec<#engine::ParamSpec> {
                #(#checks)*
                #body
            }
        }

        impl #engine::ParamField for #name {
            fn param_type() -> #engine::ParamType {
                #engine::ParamType::Table(<Self as #engine::ParamSchema>::param_specs())
            }
            const NEEDS_VALUE: bool = !#fills_defaults;
        }
    })
}
