//! A request to decide, with the bounds every interface enforces.
//!
//! HTTP, gRPC, the CLI and the tower layer all build a [`Request`] through
//! [`Request::new`], so an oversize tenant or a zero cost is refused the same
//! way everywhere, with the field named.

/// Longest tenant id, in bytes.
pub const MAX_TENANT_BYTES: usize = 256;
/// Longest subject, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 256;
/// Longest route, in bytes.
pub const MAX_ROUTE_BYTES: usize = 1024;
/// Largest cost of one request.
pub const MAX_COST: u64 = 1_000_000;
/// Largest cost recorded after the fact (a report, a settle): usage such
/// as LLM tokens can be far above what one request may ask for.
pub const MAX_REPORTED_COST: u64 = u32::MAX as u64;
/// Longest fingerprint (the duplicate guard's), in bytes.
pub const MAX_FINGERPRINT_BYTES: usize = 256;

/// What to decide: who, doing what, costing how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The tenant (1..=256 bytes).
    pub tenant: &'a str,
    /// The route, e.g. `POST /v1/invoices` (1..=1024 bytes).
    pub route: &'a str,
    /// The subject within the tenant, if any (1..=256 bytes).
    pub subject: Option<&'a str>,
    /// Units consumed (1..=1,000,000).
    pub cost: u64,
    /// What tells two submissions apart for the duplicate guard (an
    /// idempotency key, 1..=256 bytes); `None`: one admission per window per
    /// subject on guarded routes.
    pub fingerprint: Option<&'a str>,
}

/// A request field out of bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {problem}")]
pub struct RequestError {
    /// The field at fault.
    pub field: &'static str,
    /// What is wrong and what is allowed.
    pub problem: String,
}

impl RequestError {
    /// An error about `field`.
    pub fn new(field: &'static str, problem: impl Into<String>) -> RequestError {
        RequestError {
            field,
            problem: problem.into(),
        }
    }
}

impl<'a> Request<'a> {
    /// Checks every bound.
    #[inline]
    pub fn new(
        tenant: &'a str,
        route: &'a str,
        subject: Option<&'a str>,
        cost: u64,
    ) -> Result<Request<'a>, RequestError> {
        check_len("tenant", tenant, MAX_TENANT_BYTES)?;
        check_len("route", route, MAX_ROUTE_BYTES)?;
        if let Some(subject) = subject {
            check_len("subject", subject, MAX_SUBJECT_BYTES)?;
        }
        check_cost(cost)?;
        Ok(Request {
            tenant,
            route,
            subject,
            cost,
            fingerprint: None,
        })
    }

    /// A cost already spent (`/v1/report`): checked like
    /// [`new`](Self::new), the cost from 1 to [`MAX_REPORTED_COST`].
    pub fn spent(
        tenant: &'a str,
        route: &'a str,
        subject: Option<&'a str>,
        cost: u64,
    ) -> Result<Request<'a>, RequestError> {
        let request = Request::new(tenant, route, subject, 1)?;
        if !(1..=MAX_REPORTED_COST).contains(&cost) {
            return Err(RequestError::new(
                "cost",
                format!("must be a whole number from 1 to {MAX_REPORTED_COST}, got {cost}"),
            ));
        }
        Ok(Request { cost, ..request })
    }

    /// The same request with a fingerprint for the duplicate guard.
    pub fn with_fingerprint(
        mut self,
        fingerprint: Option<&'a str>,
    ) -> Result<Request<'a>, RequestError> {
        if let Some(f) = fingerprint {
            check_len("fingerprint", f, MAX_FINGERPRINT_BYTES)?;
        }
        self.fingerprint = fingerprint;
        Ok(self)
    }
}

#[inline]
fn check_len(field: &'static str, value: &str, max: usize) -> Result<(), RequestError> {
    if value.is_empty() || value.len() > max {
        return Err(RequestError::new(
            field,
            format!("must be 1 to {max} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

/// Checks a cost given as a signed number, as JSON and headers carry it.
pub fn check_cost_signed(cost: i128) -> Result<u64, RequestError> {
    let cost = u64::try_from(cost).map_err(|_| cost_error(cost))?;
    check_cost(cost).map(|()| cost)
}

#[inline]
fn check_cost(cost: u64) -> Result<(), RequestError> {
    if (1..=MAX_COST).contains(&cost) {
        Ok(())
    } else {
        Err(cost_error(cost.into()))
    }
}

fn cost_error(cost: i128) -> RequestError {
    RequestError::new(
        "cost",
        format!("must be a whole number from 1 to {MAX_COST}, got {cost}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_the_field() {
        assert!(Request::new("t", "GET /", None, 1).is_ok());
        let long = "x".repeat(257);
        assert_eq!(
            Request::new(&long, "GET /", None, 1).unwrap_err().field,
            "tenant"
        );
        assert_eq!(
            Request::new("", "GET /", None, 1).unwrap_err().field,
            "tenant"
        );
        assert_eq!(Request::new("t", "", None, 1).unwrap_err().field, "route");
        assert_eq!(
            Request::new("t", "GET /", Some(""), 1).unwrap_err().field,
            "subject"
        );
        assert_eq!(
            Request::new("t", "GET /", None, 0).unwrap_err().field,
            "cost"
        );
        assert_eq!(
            Request::new("t", "GET /", None, MAX_COST + 1)
                .unwrap_err()
                .field,
            "cost"
        );
        assert_eq!(
            check_cost_signed(-5).unwrap_err().to_string(),
            "`cost` must be a whole number from 1 to 1000000, got -5"
        );
        assert_eq!(check_cost_signed(7), Ok(7));
    }
}
