//! Storage keys: `<prefix>{<domain>|<first entry>}<rest>`, injective and hash-tagged.
//!
//! OWNER: algorithm/memory helper.
