package lab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/kvroute/kvroute/picker/score"
)

// Encode is results.json's bytes: indented, deterministic.
func Encode(r *Results) ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Write writes dir/results.json, dir/summary.txt and dir/report.html.
func Write(dir string, r *Results) error {
	b, err := Encode(r)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(Table(r)), 0o644); err != nil {
		return err
	}
	var page bytes.Buffer
	if err := WriteReport(&page, r); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.html"), page.Bytes(), 0o644)
}

// Table is the sweep as text: per rate, each policy's figures with their
// intervals, then the ratios to the best peer, then goodput.
func Table(r *Results) string {
	var b bytes.Buffer
	claim := "tuning seeds (not for claims)"
	if r.ClaimSeeds {
		claim = "claim seeds"
	}
	prio := ""
	if r.EnginePriority {
		prio = ", engine priority"
	}
	fmt.Fprintf(&b, "scenario %s: %d engines × %d blocks (profile %s), %d picker(s)%s; seeds %s (%s); SLO p90 ≤ %s\n",
		r.Scenario, r.Engines, r.GPUBlocks, r.Profile, r.Pickers, prio, seedRange(r.Seeds), claim, msText(float64(r.SLOms)))
	for _, rate := range r.Rates {
		fmt.Fprintf(&b, "\nrate ×%g — mean over %d seeds [95%% interval]\n", rate, len(r.Seeds))
		tw := tabwriter.NewWriter(&b, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "policy\thit rate\tTTFT mean\tTTFT p90\tTTFT p99\tcompleted\t429\twarm returns\tload CV\t")
		for _, s := range r.Summary {
			if s.Rate != rate {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t\n", label(r, s.Policy), ciText(s.HitRate, pctText), ciText(s.TTFTMean, msText),
				ciText(s.TTFTP90, msText), ciText(s.TTFTP99, msText), ciText(s.CompletedShare, pctText), s.Refused429,
				ciText(s.WarmReturnRate, pctText), ciText(s.LoadCV, ratioText))
		}
		tw.Flush()
		tierTable(&b, r, rate)
		tenantTable(&b, r, rate)
		if len(r.VsBestPeer) > 0 {
			fmt.Fprintf(&b, "\nrate ×%g — ÷ the best peer on each seed: mean ratio [bootstrap 95%%]\n", rate)
			tw = tabwriter.NewWriter(&b, 2, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "policy\thit rate\tTTFT mean\tTTFT p90\tTTFT p99\t")
			for _, p := range r.Policies {
				row := []string{label(r, p)}
				for _, fig := range compared() {
					for _, x := range r.VsBestPeer {
						if x.Rate == rate && x.Policy == p && x.Figure == fig.name {
							row = append(row, ciText(x.Ratio, ratioText))
						}
					}
				}
				fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
			}
			tw.Flush()
		}
	}
	if len(r.Goodput) > 0 {
		fmt.Fprintf(&b, "\ngoodput: the highest rate (× nominal) with p90 TTFT ≤ %s and ≥ 99%% completed, mean over seeds [95%%]\n", msText(float64(r.SLOms)))
		tw := tabwriter.NewWriter(&b, 2, 8, 2, ' ', 0)
		for _, g := range r.Goodput {
			fmt.Fprintf(tw, "%s\t%s\t\n", label(r, g.Policy), ciText(g.Goodput, goodputText))
		}
		tw.Flush()
	}
	byPickersTable(&b, r)
	return b.String()
}

// byPickersTable writes, when the sweep ran at several numbers of
// pickers, each policy's figures by count and their ratios to one
// picker.
func byPickersTable(b *bytes.Buffer, r *Results) {
	bp := r.ByPickers
	if bp == nil {
		return
	}
	var counts []string
	for _, n := range bp.Counts {
		counts = append(counts, fmt.Sprint(n))
	}
	fmt.Fprintf(b, "\nby pickers: the sweep at %s pickers (requests spread at random), the same seeds and rates; ÷ 1 picker paired by seed: mean ratio [bootstrap 95%%]\n",
		strings.Join(counts, ", "))
	for _, rate := range r.Rates {
		fmt.Fprintf(b, "\nrate ×%g — by pickers, mean over %d seeds [95%% interval]\n", rate, len(r.Seeds))
		tw := tabwriter.NewWriter(b, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "policy\tpickers\thit rate\thit ÷ 1\tTTFT p99\tp99 ÷ 1\tload CV\twarm returns\t")
		for _, x := range bp.Rows {
			if x.Rate != rate {
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", label(r, x.Policy), x.Pickers, ciText(x.HitRate, pctText), pairedText(x.HitRatio),
				ciText(x.TTFTP99, msText), pairedText(x.TTFTP99Ratio), ciText(x.LoadCV, ratioText), ciText(x.WarmReturnRate, pctText))
		}
		tw.Flush()
	}
	if len(bp.Goodput) > 0 {
		fmt.Fprintf(b, "\ngoodput by pickers, mean over seeds [95%%]; ÷ 1 picker paired by seed [bootstrap 95%%]\n")
		tw := tabwriter.NewWriter(b, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "policy\tpickers\tgoodput\tgoodput ÷ 1\t")
		for _, g := range bp.Goodput {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\n", label(r, g.Policy), g.Pickers, ciText(g.Goodput, goodputText), pairedText(g.Ratio))
		}
		tw.Flush()
	}
}

// pairedText is a paired ratio, "—" where there is none (one picker).
func pairedText(p *Paired) string {
	if p == nil {
		return "—"
	}
	return ciText(p.Ratio, ratioText)
}

func goodputText(x float64) string { return fmt.Sprintf("×%.2f", x) }

// tierTable writes, when any policy touched a tier at rate, where the
// prompts' KV came from and the pulls.
func tierTable(b *bytes.Buffer, r *Results, rate float64) {
	any := false
	for _, s := range r.Summary {
		any = any || s.Rate == rate && s.Tiers != nil
	}
	if !any {
		return
	}
	fmt.Fprintf(b, "\nrate ×%g — where the prompt tokens' KV came from (shares), and the pulls (summed over seeds)\n", rate)
	tw := tabwriter.NewWriter(b, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tGPU hit\tCPU hit\tpulled\trecomputed\tsources named\tpulls\tmissed\tGB pulled\tbusiest source\tfailed with a source\t")
	for _, s := range r.Summary {
		if s.Rate != rate || s.Tiers == nil {
			continue
		}
		t := s.Tiers
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%d\t\n", label(r, s.Policy), pctText(float64(t.GPUHit.Mean)),
			pctText(float64(t.CPUHit.Mean)), pctText(float64(t.Pulled.Mean)), pctText(float64(t.Recomputed.Mean)), t.SourcesNamed, t.Pulls,
			t.MissedPulls, fmt.Sprintf("%.1f", float64(t.PulledGB.Mean)), pctText(float64(t.MaxSourceShare.Mean)), t.FailedWithPull)
	}
	tw.Flush()
}

// label is a policy's name in tables: llm-d-precise on a Responses
// scenario is "llm-d-precise (given tokens)" (upstream llm-d cannot
// tokenize Responses; peer-policies.md §1.1); llm-d is "llm-d (default)"
// beside llm-d-calibrated.
func label(r *Results, p string) string {
	switch {
	case p == string(score.LLMDPrecise) && r.GivenTokens:
		return p + " (given tokens)"
	case p == string(score.LLMD) && r.LLMDCalibration != nil:
		return p + " (default)"
	}
	return p
}

func ciText(c CI, f func(float64) string) string {
	if math.IsNaN(float64(c.Mean)) {
		return "—"
	}
	if c.N < 2 || math.IsNaN(float64(c.Lo)) {
		return f(float64(c.Mean))
	}
	return fmt.Sprintf("%s [%s, %s]", f(float64(c.Mean)), f(float64(c.Lo)), f(float64(c.Hi)))
}

func pctText(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.1f%%", 100*x)
}
func msText(x float64) string    { return fmt.Sprintf("%.0f ms", x) }
func ratioText(x float64) string { return fmt.Sprintf("%.3f", x) }

// seedRange writes seeds as A-B when they run on, else as a list.
func seedRange(s []uint64) string {
	if len(s) == 0 {
		return "none"
	}
	run := true
	for i := 1; i < len(s); i++ {
		run = run && s[i] == s[i-1]+1
	}
	if run && len(s) > 1 {
		return fmt.Sprintf("%d-%d", s[0], s[len(s)-1])
	}
	var parts []string
	for _, x := range s {
		parts = append(parts, fmt.Sprint(x))
	}
	return strings.Join(parts, ",")
}
