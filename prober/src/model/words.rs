//! `Display` and `FromStr` for the plain domain enums (XDP mode, reflector,
//! timestamp source), written once from each type's `ALL` and `as_str`.

/// `Display` and `FromStr` from `ALL` and `as_str`, so the words are
/// written once.
macro_rules! words {
    ($t:ty, $what:literal) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                let t = s.trim().to_ascii_lowercase();
                <$t>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == t)
                    .ok_or_else(|| {
                        let all: Vec<&str> = <$t>::ALL.iter().map(|v| v.as_str()).collect();
                        format!("invalid {} {s:?}: use one of {}", $what, all.join(", "))
                    })
            }
        }
    };
}
pub(crate) use words;
