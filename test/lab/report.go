package lab

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"strings"

	"github.com/kvroute/kvroute/test/chartjs"
)

//go:embed report.html.tmpl
var reportTemplate string

// reportRow is one policy's line of a rate's table.
type reportRow struct {
	Policy, Hit, Mean, P90, P99, Completed string
	Refused                                int
	HasRatios                              bool
	HitRatio, MeanRatio, P90Ratio          string
}

type reportTable struct {
	Rate   float64
	Rows   []reportRow
	Ratios bool
	Tiers  []reportTiers
}

// reportTiers is one policy's line of a rate's tier table.
type reportTiers struct {
	Policy, GPU, CPU, Pulled, Recomputed, GB, Busiest string
	Named, Pulls, Missed, Failed                      int
}

type reportGoodput struct{ Policy, CI, PerSeed string }

type reportData struct {
	R       *Results
	ID      string
	Seeds   string
	Rates   string
	SLO     float64
	Tables  []reportTable
	Goodput []reportGoodput
	ChartJS template.JS
}

func reportDataOf(r *Results) reportData {
	d := reportData{R: r, ID: "lab-" + r.Scenario, Seeds: seedRange(r.Seeds), SLO: float64(r.SLOms)}
	var rates []string
	for _, rate := range r.Rates {
		rates = append(rates, fmt.Sprint(rate))
		t := reportTable{Rate: rate, Ratios: len(r.VsBestPeer) > 0}
		for _, s := range r.Summary {
			if s.Rate != rate {
				continue
			}
			row := reportRow{Policy: label(r, s.Policy), Hit: ciText(s.HitRate, pctText), Mean: ciText(s.TTFTMean, msText),
				P90: ciText(s.TTFTP90, msText), P99: ciText(s.TTFTP99, msText), Completed: ciText(s.CompletedShare, pctText),
				Refused: s.Refused429, HasRatios: t.Ratios}
			for _, x := range r.VsBestPeer {
				if x.Rate != rate || x.Policy != s.Policy {
					continue
				}
				switch x.Figure {
				case "hit_rate":
					row.HitRatio = ciText(x.Ratio, ratioText)
				case "ttft_mean_ms":
					row.MeanRatio = ciText(x.Ratio, ratioText)
				case "ttft_p90_ms":
					row.P90Ratio = ciText(x.Ratio, ratioText)
				}
			}
			t.Rows = append(t.Rows, row)
			if tt := s.Tiers; tt != nil {
				t.Tiers = append(t.Tiers, reportTiers{Policy: row.Policy, GPU: ciText(tt.GPUHit, pctText), CPU: ciText(tt.CPUHit, pctText),
					Pulled: ciText(tt.Pulled, pctText), Recomputed: ciText(tt.Recomputed, pctText), GB: ciText(tt.PulledGB, gbText),
					Busiest: ciText(tt.MaxSourceShare, pctText), Named: tt.SourcesNamed, Pulls: tt.Pulls, Missed: tt.MissedPulls, Failed: tt.FailedWithPull})
			}
		}
		d.Tables = append(d.Tables, t)
	}
	d.Rates = strings.Join(rates, ", ")
	for _, g := range r.Goodput {
		var per []string
		for _, x := range g.PerSeed {
			per = append(per, fmt.Sprintf("%.2f", float64(x)))
		}
		d.Goodput = append(d.Goodput, reportGoodput{Policy: label(r, g.Policy), CI: ciText(g.Goodput, func(x float64) string { return fmt.Sprintf("×%.2f", x) }),
			PerSeed: strings.Join(per, " ")})
	}
	return d
}

func gbText(x float64) string { return fmt.Sprintf("%.1f GB", x) }

// Section is the lab's part of an HTML report: its tables and charts,
// drawn by Chart.js, which the page must load (before or after it).
func Section(r *Results) (template.HTML, error) {
	t, err := template.New("lab").Parse(reportTemplate)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "section", reportDataOf(r)); err != nil {
		return "", err
	}
	return template.HTML(b.String()), nil
}

// WriteReport writes r as a self-contained report.html.
func WriteReport(w io.Writer, r *Results) error {
	t, err := template.New("lab").Parse(reportTemplate)
	if err != nil {
		return err
	}
	d := reportDataOf(r)
	d.ChartJS = template.JS(chartjs.Source())
	return t.ExecuteTemplate(w, "page", d)
}
