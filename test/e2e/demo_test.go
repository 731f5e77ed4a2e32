package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestDemo runs `kvroute demo` as a user would (with simulated time not
// waited for and without its lab section, to keep the test short), with
// --keep-running: it prints the
// table of all four policies, writes the report, then leaves a fleet up
// whose picker answers the official OpenAI SDK at the printed URL, and
// exits 0 on SIGTERM.
func TestDemo(t *testing.T) {
	bin := buildKvroute(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "demo-report")
	// --lab=false: the demo's lab section (150 virtual-time runs) would add
	// half a minute to this package, the longest of make test; the lab and
	// the report's lab section have their own tests (test/lab,
	// cmd/kvroute's TestLabCommand, test/bench's TestReportInChromium).
	cmd := exec.Command(bin, "demo", "--time-scale", "0", "--out", out, "--keep-running", "--lab=false")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`picker \(policy precise\) at (http://127\.0\.0\.1:\d+)`)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		exited <- cmd.Wait()
	}()
	output := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines, "\n")
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("demo output:\n%s", output())
		}
	})
	var url string
	select {
	case url = <-urls:
	case err := <-exited:
		t.Fatalf("demo exited before keeping a fleet running: %v", err)
	case <-time.After(4 * time.Minute):
		t.Fatal("no fleet URL after 4 minutes")
	}
	text := output()
	for _, p := range []string{"round-robin", "least-loaded", "prefix-hash", "precise"} {
		if !regexp.MustCompile(`(?m)^` + p + ` +\d+ +0 `).MatchString(text) {
			t.Errorf("the table has no error-free line for %s", p)
		}
	}
	for _, f := range []string{"report.html", "results.json", "summary.txt"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Fleet struct {
			Engines int `json:"engines"`
		} `json:"fleet"`
		Policies map[string]struct {
			Requests int `json:"requests"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(raw, &res); err != nil || res.Fleet.Engines != 4 || len(res.Policies) != 4 || res.Policies["precise"].Requests < 30 {
		t.Fatalf("results.json: %v %+v", err, res)
	}

	// The fleet left running answers the official SDK through the picker.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var resp *http.Response
	c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     "Qwen/Qwen3-0.6B",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello from the demo test")},
		MaxTokens: openai.Int(4),
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if chat.Choices[0].Message.Content == "" || resp.Header.Get("X-Kvroute-Endpoint") == "" {
		t.Fatalf("answer %+v, endpoint %q", chat, resp.Header.Get("X-Kvroute-Endpoint"))
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("demo exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("demo still running 20 s after SIGTERM")
	}
}
