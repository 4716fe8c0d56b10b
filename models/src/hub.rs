//! Hugging Face hub ids resolved through the local cache, never the network.
//!
//! A model path that is not a directory but reads as a hub id, `org/name` or
//! `org/name@revision`, names the snapshot `huggingface_hub` keeps in its cache (the layout of
//! its `file_download.py`):
//!
//! ```text
//! <cache>/models--org--name/refs/<revision>          a file holding the commit hash
//! <cache>/models--org--name/snapshots/<hash>/...     the files (links into blobs/)
//! ```
//!
//! The revision defaults to `main`; a 40-digit commit hash names its snapshot directly. The
//! cache is `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub` (the order of
//! `huggingface_hub.constants`). A leading `~/` in any model path is the home directory.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// A hub id split into repository and revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId<'a> {
    /// `org/name`.
    pub repo: &'a str,
    /// `main` unless `@revision` was given.
    pub revision: &'a str,
}

impl<'a> HubId<'a> {
    /// `org/name` or `org/name@revision` with `huggingface_hub`'s repo-id characters (letters,
    /// digits, `-`, `_`, `.`; no `--` or `..`, neither end a `-` or `.`); anything else is a path.
    pub fn parse(text: &'a str) -> Option<Self> {
        let (repo, revision) = match text.split_once('@') {
            Some((repo, revision)) if !revision.is_empty() && !revision.contains('@') => {
                (repo, revision)
            }
            Some(_) => return None,
            None => (text, "main"),
        };
        let (org, name) = repo.split_once('/')?;
        let part = |s: &str| {
            !s.is_empty()
                && s.len() <= 96
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && !s.contains("--")
                && !s.contains("..")
                && !s.starts_with(['-', '.'])
                && !s.ends_with(['-', '.'])
        };
        (part(org) && part(name)).then_some(Self { repo, revision })
    }

    /// The repository's folder in the cache: `models--org--name`.
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }

    /// The command that puts this id into the cache.
    pub fn download_command(&self) -> String {
        match self.revision {
            "main" => format!("huggingface-cli download {}", self.repo),
            rev => format!("huggingface-cli download {} --revision {rev}", self.repo),
        }
    }
}

/// The hub cache `huggingface_hub` uses under the environment `var`, with where it came from.
pub fn cache_dir_from(var: impl Fn(&str) -> Option<String>) -> Option<(PathBuf, &'static str)> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty());
    if let Some(dir) = set("HF_HUB_CACHE") {
        return Some((expand_home(Path::new(&dir), &var), "HF_HUB_CACHE"));
    }
    if let Some(home) = set("HF_HOME") {
        return Some((expand_home(Path::new(&home), &var).join("hub"), "HF_HOME"));
    }
    let home = set("HOME")?;
    Some((
        Path::new(&home).join(".cache/huggingface/hub"),
        "the default ~/.cache/huggingface/hub",
    ))
}

/// `path` with a leading `~/` (or a lone `~`) replaced by `$HOME`.
fn expand_home(path: &Path, var: &impl Fn(&str) -> Option<String>) -> PathBuf {
    let Some(home) = var("HOME").filter(|h| !h.is_empty()) else {
        return path.to_path_buf();
    };
    match path.strip_prefix("~") {
        Ok(rest) => Path::new(&home).join(rest),
        Err(_) => path.to_path_buf(),
    }
}

/// The snapshot directory of `id` in `cache`, if the cache holds it.
pub fn snapshot(cache: &Path, id: &HubId<'_>) -> Option<PathBuf> {
    let repo = cache.join(id.cache_folder());
    let hash = match std::fs::read_to_string(repo.join("refs").join(id.revision)) {
        Ok(hash) => hash.trim().to_string(),
        Err(_) => id.revision.to_string(),
    };
    let dir = repo.join("snapshots").join(hash);
    dir.is_dir().then_some(dir)
}

/// The directory a model path names: `path` itself when it is a directory (after `~/`), else
/// the cached snapshot of the hub id it reads as, else an error that says where it looked and
/// how to download it; a path that is neither a directory nor a hub id comes back unchanged,
/// for the caller's own "does not exist".
pub fn resolve_model_path(path: &Path) -> Result<PathBuf> {
    resolve_with(path, |k| std::env::var(k).ok())
}

/// [`resolve_model_path`] under the environment `var`.
pub fn resolve_with(path: &Path, var: impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    let local = expand_home(path, &var);
    if local.is_dir() {
        return Ok(local);
    }
    let Some(id) = path.to_str().and_then(HubId::parse) else {
        return Ok(local);
    };
    let Some((cache, source)) = cache_dir_from(&var) else {
        bail!(
            "`{}` does not exist, and no Hugging Face cache is known to look it up in as a hub id \
             (set HF_HUB_CACHE or HF_HOME); flowrl never downloads: `{}` puts it in the cache",
            path.display(),
            id.download_command()
        );
    };
    if let Some(dir) = snapshot(&cache, &id) {
        return Ok(dir);
    }
    let folder = cache.join(id.cache_folder());
    let found = if folder.is_dir() {
        format!(
            "{} has no snapshot for revision `{}`",
            folder.display(),
            id.revision
        )
    } else {
        format!("{} does not exist", folder.display())
    };
    bail!(
        "`{}` does not exist, nor is it in the Hugging Face cache {} ({source}: {found}); \
         flowrl never downloads: `{}` puts it in the cache",
        path.display(),
        cache.display(),
        id.download_command()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    /// A cache laid out as `huggingface_hub` lays it out: refs, snapshots, blobs.
    fn cache_with(root: &Path, repo: &str, refs: &[(&str, &str)]) -> PathBuf {
        let folder = root.join(format!("models--{}", repo.replace('/', "--")));
        for (revision, hash) in refs {
            let snapshot = folder.join("snapshots").join(hash);
            std::fs::create_dir_all(&snapshot).unwrap();
            std::fs::create_dir_all(folder.join("blobs")).unwrap();
            std::fs::write(folder.join("blobs").join(hash), "{}").unwrap();
            std::fs::write(snapshot.join("config.json"), "{}").unwrap();
            let refs = folder.join("refs");
            std::fs::create_dir_all(&refs).unwrap();
            std::fs::write(refs.join(revision), hash).unwrap();
        }
        folder
    }

    #[test]
    fn ids_and_paths_are_told_apart() {
        let id = HubId::parse("Qwen/Qwen2.5-VL-7B-Instruct").unwrap();
        assert_eq!(
            (id.repo, id.revision),
            ("Qwen/Qwen2.5-VL-7B-Instruct", "main")
        );
        assert_eq!(id.cache_folder(), "models--Qwen--Qwen2.5-VL-7B-Instruct");
        let id = HubId::parse("org/name@v1.0").unwrap();
        assert_eq!((id.repo, id.revision), ("org/name", "v1.0"));
        assert_eq!(
            id.download_command(),
            "huggingface-cli download org/name --revision v1.0"
        );
        for path in [
            "/abs/dir",
            "./org/name",
            "../org",
            "a/b/c",
            "org/",
            "name",
            "~/models/x",
            "org/na--me",
            "org/name@",
            "org/.hidden",
        ] {
            assert_eq!(HubId::parse(path), None, "{path}");
        }
    }

    #[test]
    fn the_cache_follows_huggingface_hubs_order() {
        let dir = |pairs: &[(&str, &str)]| cache_dir_from(env(pairs)).map(|(d, _)| d);
        assert_eq!(
            dir(&[("HF_HUB_CACHE", "/c"), ("HF_HOME", "/h"), ("HOME", "/u")]),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            dir(&[("HF_HOME", "~/hf"), ("HOME", "/u")]),
            Some(PathBuf::from("/u/hf/hub"))
        );
        assert_eq!(
            dir(&[("HOME", "/u")]),
            Some(PathBuf::from("/u/.cache/huggingface/hub"))
        );
        assert_eq!(dir(&[]), None);
    }

    #[test]
    fn ids_resolve_to_their_snapshot_by_ref_or_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("hub");
        let main = "a".repeat(40);
        let tagged = "b".repeat(40);
        let folder = cache_with(&cache, "org/model", &[("main", &main), ("v2", &tagged)]);
        let vars = env(&[("HF_HUB_CACHE", cache.to_str().unwrap())]);
        let resolve = |p: &str| resolve_with(Path::new(p), &vars);
        assert_eq!(
            resolve("org/model").unwrap(),
            folder.join("snapshots").join(&main)
        );
        assert_eq!(
            resolve("org/model@v2").unwrap(),
            folder.join("snapshots").join(&tagged)
        );
        assert_eq!(
            resolve(&format!("org/model@{tagged}")).unwrap(),
            folder.join("snapshots").join(&tagged)
        );
        // A local directory of the same name wins, as in transformers.
        let local = tmp.path().join("org/model");
        std::fs::create_dir_all(&local).unwrap();
        assert_eq!(
            resolve_with(&local, &vars).unwrap(),
            local,
            "an existing directory is taken as it is"
        );
        // Not a hub id and not a directory: unchanged, for the caller's own message.
        assert_eq!(
            resolve("no/such/dir").unwrap(),
            PathBuf::from("no/such/dir")
        );
    }

    #[test]
    fn a_missing_id_says_where_it_looked_and_how_to_download_it() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("hub");
        cache_with(&cache, "org/model", &[("main", &"c".repeat(40))]);
        let vars = env(&[("HF_HUB_CACHE", cache.to_str().unwrap())]);
        let err = resolve_with(Path::new("Qwen/Qwen2.5-VL-7B-Instruct"), &vars)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("models--Qwen--Qwen2.5-VL-7B-Instruct does not exist")
                && err.contains("(HF_HUB_CACHE: ")
                && err.starts_with("`Qwen/Qwen2.5-VL-7B-Instruct` does not exist")
                && err.contains("`huggingface-cli download Qwen/Qwen2.5-VL-7B-Instruct`"),
            "{err}"
        );
        let err = resolve_with(Path::new("org/model@v9"), &vars)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("has no snapshot for revision `v9`")
                && err.contains("`huggingface-cli download org/model --revision v9`"),
            "{err}"
        );
    }

    #[test]
    fn a_leading_tilde_is_the_home_directory() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("models/x")).unwrap();
        let vars = env(&[("HOME", tmp.path().to_str().unwrap())]);
        assert_eq!(
            resolve_with(Path::new("~/models/x"), &vars).unwrap(),
            tmp.path().join("models/x")
        );
    }
}
