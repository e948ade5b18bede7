//! How a `kvmesh serve` option is declared once (the table is `super::options`): one row
//! gives its help (the doc comment), its flag and environment variable (`#[arg]`), its
//! `--config` file key (the field's name in kebab-case, `in TABLE.KEY` for a key of a
//! sub-table, or `flag only` where the file says it otherwise) and its default.
//! `serve_options!` turns the rows into:
//!
//! - `ServeArgs`, the flags (clap) and the file (serde): every option an `Option`, so that a
//!   flag not given leaves the file's value, and the file's the default;
//! - `Settled`, every option after its flag (or environment), its file key and its default, in
//!   that order: the option's type where it has a default, else an `Option` of it;
//! - `shown_default(id)`, the default a flag's help ends with (`[default: …]`, as clap writes
//!   its own), from the same row: not clap's `default_value`, which would shadow the file;
//! - for the tests, each option's samples and what it settles to, so that one test checks the
//!   precedence of the whole table.
//!
//! What no row can say (a required option, a default that is no constant, a check across
//! options) is left to `ServeConfig::resolve`. A macro rather than a trait per option: the rows
//! must become fields of one clap and serde struct, which only a macro can write.

use std::time::Duration;

/// Declares the options; see the module's documentation and `super::options` for the rows.
macro_rules! serve_options {
    (
        options {$(
            $(#[$attr:meta])*
            $field:ident : $ty:ty $(= $default:expr)?
                $(; in $table:ident . $key:ident)? $(; flag $only:ident)?
        ),* $(,)?}
        tables {$(
            $(#[$table_attr:meta])*
            $table_field:ident : $table_ty:ty
        ),* $(,)?}
    ) => {
        /// Flags of `kvmesh serve`, each also read from its environment variable and, in
        /// kebab-case, from the `--config` TOML file (e.g. `backend = "http://127.0.0.1:8001"`;
        /// routing weights under a `[route]` table with the field names of `RouteConfig`).
        #[derive(clap::Args, Debug, Default, serde::Deserialize)]
        #[cfg_attr(test, derive(serde::Serialize))]
        #[command(mut_args(in_help))]
        #[serde(deny_unknown_fields, rename_all = "kebab-case")]
        pub struct ServeArgs {
            /// TOML configuration file.
            #[arg(long, env = "KVMESH_CONFIG")]
            #[serde(skip)]
            pub config: Option<std::path::PathBuf>,
            $( $(#[$attr])* pub $field: Option<$ty>, )*
            $( $(#[$table_attr])* #[arg(skip)] pub $table_field: Option<$table_ty>, )*
        }

        /// Every option settled: its flag (or environment variable) over its file key over its
        /// default.
        #[derive(Debug)]
        pub struct Settled {
            $( pub $field: $crate::serve::declare::settled_type!($ty $(, $default)?), )*
            $( pub $table_field: Option<$table_ty>, )*
        }

        impl Settled {
            /// `cli` (flags and environment) over `file` over the defaults.
            pub fn of(cli: ServeArgs, mut file: ServeArgs) -> Self {
                // A sub-table's key is taken out of its table before the table itself moves.
                $(
                    let $field = $crate::serve::declare::settled_value!(
                        cli.$field.or($crate::serve::declare::file_value!(
                            file, $field $(, $table . $key)? $(, flag $only)?
                        ))
                        $(, $default)?
                    );
                )*
                Self {
                    $( $field, )*
                    $( $table_field: cli.$table_field.or(file.$table_field), )*
                }
            }
        }

        /// The default option `id` (clap's id: the field's name) shows in its help, if any.
        fn shown_default(id: &str) -> Option<String> {
            $($(
                if id == stringify!($field) {
                    let default: $ty = $default;
                    return Some(default.to_string());
                }
            )?)*
            None
        }

        /// Ends the help of each flag that has a default with `[default: …]`.
        fn in_help(arg: clap::Arg) -> clap::Arg {
            match shown_default(arg.get_id().as_str()) {
                Some(default) => $crate::serve::declare::with_default(arg, &default),
                None => arg,
            }
        }

        /// For the tests: every option with a flag set from its first sample in `cli` and from
        /// its second in `file`, and what each settles to given both, the file alone, and
        /// neither (as `Debug` text, by option).
        #[cfg(test)]
        pub(crate) mod precedence {
            use super::*;
            use $crate::serve::declare::Sample;

            /// `(option, given both, given the file's, given neither)`.
            pub(crate) type Expected = Vec<(&'static str, String, String, String)>;

            /// The flags (`--name=VALUE`) and a file that set every option, and what to expect.
            pub(crate) fn samples() -> (Vec<String>, ServeArgs, Expected) {
                let mut argv = vec!["serve".to_owned()];
                let mut file = ServeArgs::default();
                let mut expected = Vec::new();
                let command = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
                $(
                    let (flag, in_file) = <$ty as Sample>::samples();
                    let arg = command
                        .get_arguments()
                        .find(|arg| arg.get_id() == stringify!($field))
                        .expect("every option is an argument");
                    let long = arg.get_long().expect("every option has a flag");
                    argv.push(format!("--{long}={}", flag.flag_text()));
                    let in_file = $crate::serve::declare::file_sample!(
                        file, $field, in_file $(, $table . $key)? $(, flag $only)?
                    );
                    expected.push((
                        stringify!($field),
                        format!("{:?}", $crate::serve::declare::settled_value!(Some(flag) $(, $default)?)),
                        format!("{:?}", $crate::serve::declare::settled_value!(in_file $(, $default)?)),
                        format!("{:?}", $crate::serve::declare::settled_value!(None::<$ty> $(, $default)?)),
                    ));
                )*
                (argv, file, expected)
            }

            /// Each option of `settled` as `Debug` text.
            pub(crate) fn shown(settled: &Settled) -> Vec<(&'static str, String)> {
                vec![$( (stringify!($field), format!("{:?}", settled.$field)), )*]
            }
        }
    };
}
pub(crate) use serve_options;

/// An option's settled type: itself with a default, else an `Option` of it.
macro_rules! settled_type {
    ($ty:ty, $default:expr) => { $ty };
    ($ty:ty) => { Option<$ty> };
}
pub(crate) use settled_type;

/// An option's settled value: the given one, else its default, if it has one.
macro_rules! settled_value {
    ($given:expr, $default:expr) => {
        $given.unwrap_or_else(|| $default)
    };
    ($given:expr) => {
        $given
    };
}
pub(crate) use settled_value;

/// An option's value in the file: its top-level key, a key of a sub-table (taken out), or
/// none for an option the file says otherwise (`flag only`).
macro_rules! file_value {
    ($file:ident, $field:ident) => {
        $file.$field
    };
    ($file:ident, $field:ident, $table:ident . $key:ident) => {
        $file.$table.as_mut().and_then(|table| table.$key.take())
    };
    ($file:ident, $field:ident, flag only) => {
        None
    };
}
pub(crate) use file_value;

/// For the tests: `value` put where the option goes in the file, and what the file then gives.
#[cfg(test)]
macro_rules! file_sample {
    ($file:ident, $field:ident, $value:ident) => {{
        $file.$field = Some($value.clone());
        Some($value)
    }};
    ($file:ident, $field:ident, $value:ident, $table:ident . $key:ident) => {{
        $file.$table.get_or_insert_default().$key = Some($value.clone());
        Some($value)
    }};
    ($file:ident, $field:ident, $value:ident, flag only) => {
        // Not in the file; `$value` gives the `None` its type.
        Some($value).filter(|_| false)
    };
}
#[cfg(test)]
pub(crate) use file_sample;

/// `arg` with its help, and its long help if any, ending in `[default: DEFAULT]`.
pub fn with_default(arg: clap::Arg, default: &str) -> clap::Arg {
    let with_default = |help: &clap::builder::StyledStr| format!("{help} [default: {default}]");
    let help = arg.get_help().map(with_default);
    let long_help = arg.get_long_help().map(with_default);
    let arg = match help {
        Some(help) => arg.help(help),
        None => arg,
    };
    match long_help {
        Some(long_help) => arg.long_help(long_help),
        None => arg,
    }
}

/// A duration given in whole seconds (the flags named `…-secs`), shown as `600 s`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(from = "u64", into = "u64")]
pub struct Secs(pub u64);

/// A duration given in whole milliseconds (the flags named `…-ms`), shown as `200 ms`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(from = "u64", into = "u64")]
pub struct Millis(pub u64);

impl Secs {
    /// `duration` in whole seconds (a default's, so a whole number of them).
    pub const fn of(duration: Duration) -> Self {
        Self(duration.as_secs())
    }
}

impl Millis {
    /// `duration` in whole milliseconds (a default's, so a whole number of them).
    pub const fn of(duration: Duration) -> Self {
        Self(duration.as_millis() as u64)
    }
}

macro_rules! unit {
    ($unit:ident, $suffix:literal, $to_duration:path) => {
        impl From<u64> for $unit {
            fn from(count: u64) -> Self {
                Self(count)
            }
        }
        impl From<$unit> for u64 {
            fn from(value: $unit) -> u64 {
                value.0
            }
        }
        impl From<$unit> for Duration {
            fn from(value: $unit) -> Duration {
                $to_duration(value.0)
            }
        }
        impl std::str::FromStr for $unit {
            type Err = std::num::ParseIntError;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                text.parse().map(Self)
            }
        }
        impl std::fmt::Display for $unit {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!("{}", $suffix), self.0)
            }
        }
    };
}
unit!(Secs, " s", Duration::from_secs);
unit!(Millis, " ms", Duration::from_millis);

/// For the tests: two different values of an option's type, and how a flag spells one.
#[cfg(test)]
pub(crate) trait Sample: Sized + Clone + std::fmt::Debug {
    fn samples() -> (Self, Self);
    fn flag_text(&self) -> String;
}

#[cfg(test)]
mod samples {
    use super::{Millis, Sample, Secs};
    use kvmesh_protocol::Role;
    use kvmesh_protocol::route::ScoreForm;
    use std::net::SocketAddr;
    use std::path::PathBuf;

    /// `sample!(TYPE: FLAG'S, FILE'S)`, spelt on the command line by `Display` (or `.0`).
    macro_rules! sample {
        ($ty:ty: $a:expr, $b:expr) => {
            sample!($ty: $a, $b, |value: &$ty| value.to_string());
        };
        ($ty:ty: $a:expr, $b:expr, $text:expr) => {
            impl Sample for $ty {
                fn samples() -> (Self, Self) {
                    ($a, $b)
                }
                fn flag_text(&self) -> String {
                    $text(self)
                }
            }
        };
    }
    sample!(String: "from-flag".into(), "from-file".into());
    sample!(usize: 3, 5);
    sample!(u16: 8, 4);
    sample!(u32: 4096, 2048);
    // A switch's default is off: the file's sets it, the flag's clears it again.
    sample!(bool: false, true);
    sample!(Secs: Secs(7), Secs(11), |value: &Secs| value.0.to_string());
    sample!(Millis: Millis(70), Millis(110), |value: &Millis| value.0.to_string());
    sample!(ScoreForm: ScoreForm::Cost, ScoreForm::Score);
    sample!(Role: Role::Prefill, Role::Decode);
    sample!(SocketAddr: "127.0.0.1:1".parse().unwrap(), "127.0.0.2:2".parse().unwrap());

    impl Sample for PathBuf {
        fn samples() -> (Self, Self) {
            ("/from/flag".into(), "/from/file".into())
        }
        fn flag_text(&self) -> String {
            self.display().to_string()
        }
    }

    impl<T: Sample + std::fmt::Display> Sample for Vec<T> {
        fn samples() -> (Self, Self) {
            let (a, b) = T::samples();
            (vec![a.clone(), a], vec![b])
        }
        fn flag_text(&self) -> String {
            let texts: Vec<String> = self.iter().map(ToString::to_string).collect();
            texts.join(",")
        }
    }
}
