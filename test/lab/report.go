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
	Warm, LoadCV                           string
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

// reportPickers is the comparison by number of pickers: a table per
// rate, and goodput's.
type reportPickers struct {
	Counts  string
	Tables  []reportPickerTable
	Goodput []reportPickerGoodput
}

type reportPickerTable struct {
	Rate float64
	Rows []reportPickerRow
}

type reportPickerRow struct {
	Policy                                     string
	Pickers                                    int
	Hit, HitRatio, P99, P99Ratio, LoadCV, Warm string
}

type reportPickerGoodput struct {
	Policy         string
	Pickers        int
	Goodput, Ratio string
}

type reportData struct {
	R       *Results
	ID      string
	Seeds   string
	Rates   string
	SLO     float64
	Tables  []reportTable
	Goodput []reportGoodput
	Pickers *reportPickers
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
				Refused: s.Refused429, HasRatios: t.Ratios, Warm: ciText(s.WarmReturnRate, pctText), LoadCV: ciText(s.LoadCV, ratioText)}
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
		d.Goodput = append(d.Goodput, reportGoodput{Policy: label(r, g.Policy), CI: ciText(g.Goodput, goodputText), PerSeed: strings.Join(per, " ")})
	}
	d.Pickers = reportPickersOf(r)
	return d
}

// reportPickersOf is the by-pickers comparison's tables (nil: none).
func reportPickersOf(r *Results) *reportPickers {
	bp := r.ByPickers
	if bp == nil {
		return nil
	}
	var counts []string
	for _, n := range bp.Counts {
		counts = append(counts, fmt.Sprint(n))
	}
	out := &reportPickers{Counts: strings.Join(counts, ", ")}
	for _, rate := range r.Rates {
		t := reportPickerTable{Rate: rate}
		for _, x := range bp.Rows {
			if x.Rate == rate {
				t.Rows = append(t.Rows, reportPickerRow{Policy: label(r, x.Policy), Pickers: x.Pickers, Hit: ciText(x.HitRate, pctText),
					HitRatio: pairedText(x.HitRatio), P99: ciText(x.TTFTP99, msText), P99Ratio: pairedText(x.TTFTP99Ratio),
					LoadCV: ciText(x.LoadCV, ratioText), Warm: ciText(x.WarmReturnRate, pctText)})
			}
		}
		out.Tables = append(out.Tables, t)
	}
	for _, g := range bp.Goodput {
		out.Goodput = append(out.Goodput, reportPickerGoodput{Policy: label(r, g.Policy), Pickers: g.Pickers, Goodput: ciText(g.Goodput, goodputText),
			Ratio: pairedText(g.Ratio)})
	}
	return out
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
