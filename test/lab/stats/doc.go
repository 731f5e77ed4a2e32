// Package stats is the statistics of kvroute's virtual-time lab: the
// quantiles, confidence intervals, paired ratios and goodput its reports
// are made of.
//
// Contract:
//   - Quantile is the nearest-rank quantile, the convention of the bench's
//     reports (test/bench): on the n values sorted ascending, the value of
//     rank ⌈q·n⌉ (the first value for q·n ≤ 1). q is clamped to [0, 1].
//   - MeanCI is a sample's mean with its two-sided 95% confidence interval
//     by Student's t: mean ± t(0.975, n−1)·s/√n, s the sample standard
//     deviation (divisor n−1). The critical values for 1 to 30 degrees of
//     freedom come from a table (exact to 1e-11); beyond 30, from the
//     Cornish–Fisher expansion of t about the normal (Abramowitz and
//     Stegun 26.7.5, four terms; within 3e-8 of the exact value there).
//     With one value the interval is that value (Lo = Hi = Mean): one
//     value gives no estimate of spread, so the degenerate interval
//     claims nothing, it is not a certainty. With none, every field but N
//     is NaN.
//   - NaN values are missing measurements, and excluded: Quantile, MeanCI
//     and PairedRatio use the other values, and Interval.N says how many
//     they used (a caller that wants none missing checks N against its
//     count). Infinities are not excluded; they make the results infinite
//     or NaN.
//   - A mean is never outside the range of the values it is the mean of
//     (rounding is clamped), so a constant series has that constant as
//     its mean, exactly, and a zero-width interval.
//   - PairedRatio takes two series aligned by seed (x[i] and best[i] come
//     from the same seed) and forms each seed's ratio x[i]/best[i]. A seed
//     whose ratio is not a finite number (best[i] is 0, or a value is NaN
//     or infinite) is skipped: its entry in the returned ratios is NaN,
//     which is how the skip is reported, and N counts the seeds used. The
//     interval is the mean ratio with a bootstrap 95% percentile interval:
//     10,000 resamples of the used seeds with replacement, each
//     resample's mean computed, and Lo and Hi the nearest-rank 2.5% and
//     97.5% quantiles of those means (the 250th and the 9,750th of the
//     10,000, sorted). The resampled indices are drawn from math/rand/v2's
//     PCG seeded with (seed, 0), exactly as
//     rand.New(rand.NewPCG(seed, 0)).IntN(m) would draw them, m at a time
//     per resample: the same seed gives the same result, bit for bit, on
//     every platform. The generator is a copy of math/rand/v2's (the
//     package is a core, which imports no randomness package); the tests
//     check it against math/rand/v2 draw for draw.
//   - Goodput is the highest offered rate of a load sweep at which the p90
//     time to first token is at most the SLO and at least 99% of the
//     offered requests completed (100·Completed ≥ 99·Offered; a request
//     refused with 429 did not complete). The definition is taken
//     literally: every point is judged on its own, in no order, so a
//     passing rate counts even when a lower rate failed (a non-monotone
//     sweep's answer is its highest passing rate, not the last rate before
//     the first failure). A point with nothing offered, or a NaN rate,
//     does not pass. ok is false when no point passes.
//   - BestPerSeed gives, for each seed, the best value among the peer
//     policies on that seed (highest or lowest, as told), so each
//     policy's ratio to the best peer is taken seed by seed (PairedRatio
//     of its series and this one). A peer with a NaN on a seed has no
//     value there; a seed on which no peer has a value is NaN. The caller
//     chooses the peers, and whether a policy is among its own peers.
//   - Lengths that must agree (PairedRatio's two series, the peers'
//     series) and a peer with no series are programming errors: those
//     functions panic.
//
// The package is pure: no I/O, clock, goroutines, channels, locks,
// logging or randomness source of its own (the bootstrap's generator is
// seeded by its caller). It changes none of its arguments.
package stats
