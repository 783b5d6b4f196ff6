//! An error and its causes on one line, the way every log line and problem
//! detail in idem says why and not only what: one formatter, so that the
//! gateway, the consumer, the reconciler and the stores say it alike.

use std::error::Error;

/// `e` and its causes, `a: b: c`.
pub fn error_chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `e`'s causes only, each said once (a cause whose text an earlier one
/// already holds is left out), innermost last; `e` itself when it has no
/// cause. For clients whose errors repeat their causes' words at every
/// level (the AWS SDK's "service error" wrappers).
pub fn error_causes(e: &dyn Error) -> String {
    let mut said: Vec<String> = Vec::new();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !said.iter().any(|s| s.contains(&text)) {
            said.push(text);
        }
        next = cause.source();
    }
    if said.is_empty() {
        return e.to_string();
    }
    said.join(": ")
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    /// An error saying `text`, caused by `cause`.
    #[derive(Debug)]
    struct Layer {
        text: &'static str,
        cause: Option<Box<Layer>>,
    }

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.text)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.cause.as_deref().map(|c| c as &(dyn Error + 'static))
        }
    }

    fn layers(texts: &[&'static str]) -> Layer {
        let mut cause = None;
        for text in texts.iter().rev() {
            cause = Some(Box::new(Layer { text, cause }));
        }
        match cause {
            Some(layer) => *layer,
            None => Layer {
                text: "",
                cause: None,
            },
        }
    }

    #[test]
    fn chains_and_causes() {
        let cases: [(&[&'static str], &str, &str); 4] = [
            (&["a"], "a", "a"),
            (&["a", "b", "c"], "a: b: c", "b: c"),
            (
                &["service error", "throttled: slow down", "slow down"],
                "service error: throttled: slow down: slow down",
                "throttled: slow down",
            ),
            (&["x", "x"], "x: x", "x"),
        ];
        for (texts, chain, causes) in cases {
            let e = layers(texts);
            assert_eq!(error_chain(&e), chain, "{texts:?}");
            assert_eq!(error_causes(&e), causes, "{texts:?}");
        }
    }
}
