package bench

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"

	"github.com/kvroute/kvroute/test/lab"

	"github.com/kvroute/kvroute/test/chartjs"
)

//go:embed report.html.tmpl
var reportTemplate string

// reportRow is one policy's line of the report's table: its label
// (Results.Label) and its key in results.json.
type reportRow struct {
	Name, Key string
	R         *PolicyResult
}

// WriteReport writes report.html for r: the table, the policies against
// the best peer (when a peer policy ran), hit rate against the pooled
// bound, the TTFT distribution and the hit rate over time per policy, and
// requests answered and in flight per engine over time — charts drawn by
// Chart.js from the results embedded in the page.
func WriteReport(w io.Writer, r *Results) error {
	t, err := template.New("report").Funcs(template.FuncMap{
		"pct":      func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
		"ms":       func(f float64) string { return fmt.Sprintf("%.0f ms", f) },
		"ratio":    ratioText,
		"label":    r.Label,
		"figure":   figureName,
		"vschance": func(x *PolicyResult) string { return vsChance(x, r.WarmReturnChance) },
		"secs": func(s *float64) string {
			if s == nil {
				return "not back"
			}
			return fmt.Sprintf("%.0f s", *s)
		},
	}).Parse(reportTemplate)
	if err != nil {
		return err
	}
	var rows []reportRow
	for _, p := range r.Order {
		if pr := r.Policies[p]; pr != nil {
			rows = append(rows, reportRow{r.Label(p), p, pr})
		}
	}
	// The resource charts: when some policy has samples.
	resources, note := false, ""
	for _, row := range rows {
		if row.R.Resources != nil {
			resources, note = true, row.R.Resources.Note
		}
	}
	var labSection template.HTML
	if r.Lab != nil {
		if labSection, err = lab.Section(r.Lab); err != nil {
			return err
		}
	}
	return t.Execute(w, struct {
		Results       *Results
		Rows          []reportRow
		ChartJS       template.JS
		Resources     bool
		ResourcesNote string
		Lab           template.HTML
	}{r, rows, template.JS(chartjs.Source()), resources, note, labSection})
}
