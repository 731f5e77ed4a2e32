package inject

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"mvdan.cc/sh/v3/syntax"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// The shells whose scripts inject reads, and their grammar.
var shells = map[string]syntax.LangVariant{
	"sh":   syntax.LangPOSIX,
	"dash": syntax.LangPOSIX,
	"ash":  syntax.LangPOSIX,
	"bash": syntax.LangBash,
}

// otherShells run scripts inject does not read.
var otherShells = []string{"zsh", "ksh", "mksh", "fish", "csh", "tcsh"}

// shellScript finds a shell script in a container's command and args:
// `sh -c SCRIPT` (or bash, options such as -ec or -o pipefail around the
// -c, /usr/bin/env before the shell). It returns the shell's name and the
// script's index in words; no shell if words run none (`bash FILE` runs a
// file, not a script inject can read).
func shellScript(words []string) (shell string, at int, err error) {
	i := 0
	if len(words) > 1 && path.Base(words[0]) == "env" {
		i = 1
	}
	if i >= len(words) {
		return "", 0, nil
	}
	sh := path.Base(words[i])
	_, known := shells[sh]
	if !known && !slices.Contains(otherShells, sh) {
		return "", 0, nil
	}
	hasC := false
	for i++; i < len(words); i++ {
		w := words[i]
		if w == "--" || w == "-" {
			i++
			break
		}
		if len(w) < 2 || (w[0] != '-' && w[0] != '+') {
			break
		}
		if strings.HasPrefix(w, "--") {
			if w == "--rcfile" || w == "--init-file" {
				i++
			}
			continue
		}
		if w[0] == '-' && strings.Contains(w[1:], "c") {
			hasC = true
		}
		if strings.ContainsAny(w[1:], "oO") {
			i++ // -o OPTION
		}
	}
	switch {
	case !hasC:
		return "", 0, nil
	case !known:
		return "", 0, fmt.Errorf("runs a %s -c script; inject reads sh and bash scripts: run it with sh or bash, or give vLLM's command and flags as lists (command: [vllm, serve, …])", sh)
	case i >= len(words):
		return "", 0, fmt.Errorf("runs %s -c with no script after it", sh)
	}
	return sh, i, nil
}

// script is a shell script in a container's command or args, and where in
// it the vLLM command ends.
type script struct {
	node *yaml.Node // the YAML string holding it
	text string
	end  int // byte offset in text after the vLLM command's last word
}

// add appends flags to the script's vLLM command: the rest of the script
// stays as it was, byte for byte.
func (s *script) add(flags []string) {
	var b strings.Builder
	for _, f := range flags {
		b.WriteByte(' ')
		b.WriteString(shellFlag(f))
	}
	s.node.Value = s.text[:s.end] + b.String() + s.text[s.end:]
}

// shellFlag quotes a flag for a shell: a --name=value's value in single
// quotes when it needs quoting.
func shellFlag(f string) string {
	name, v, ok := strings.Cut(f, "=")
	if !ok {
		return quote(f)
	}
	return quote(name) + "=" + quote(v)
}

func quote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:,@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// invocation is a vLLM server command found in a script.
type invocation struct {
	call  *syntax.CallExpr
	path  []syntax.Node // from the file down to call
	start int           // index of its first flag in call.Args
	what  string        // "vllm serve", …
}

// readScript reads a vLLM container's shell script: it accepts one vLLM
// server command, a simple command ending the script (setup commands
// before it joined by ;, && or newlines), and refuses anything else, saying
// why.
func readScript(shell string, node *yaml.Node, looks string) (vllmCommand, error) {
	text := node.Value
	f, err := syntax.NewParser(syntax.Variant(shells[shell])).Parse(strings.NewReader(text), "")
	if err != nil {
		return vllmCommand{}, fmt.Errorf("its %s script does not parse (%v); fix it, or give vLLM's command and flags as lists (command: [vllm, serve, …])", shell, err)
	}
	src := func(n syntax.Node) string { return snippet(text, n) }
	var found []invocation
	var mentions []string
	ray := false
	var stack []syntax.Node
	syntax.Walk(f, func(n syntax.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		call, ok := n.(*syntax.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		words := wordArgs(call.Args, text)
		if start, what, ok := recognize(words); ok {
			found = append(found, invocation{call: call, path: append([]syntax.Node(nil), stack...), start: start, what: what})
			return true
		}
		if rayWorker(words) {
			ray = true
		}
		for _, w := range words {
			if path.Base(w.val) == "vllm" || strings.Contains(w.val, "vllm.entrypoints") {
				mentions = append(mentions, src(call))
				break
			}
		}
		return true
	})
	switch {
	case len(found) == 0 && ray:
		return vllmCommand{why: "runs a Ray worker (no API server)"}, nil
	case len(found) == 0:
		msg := fmt.Sprintf("it looks like vLLM (%s), but its %s script runs no vLLM server inject can add flags to: `vllm serve …` or `python3 -m vllm.entrypoints.openai.api_server …`, after exec or VAR=value at most", looks, shell)
		if len(mentions) > 0 {
			msg += fmt.Sprintf(" (it has `%s`)", mentions[0])
		}
		return vllmCommand{}, fmt.Errorf("%s; if it serves no OpenAI API (a Ray worker, say), name the containers that do with --vllm-container", msg)
	case len(found) > 1:
		return vllmCommand{}, fmt.Errorf("its script runs vLLM %d times (`%s` and `%s`); inject adds its flags to a container's one vLLM server: run each in its own container", len(found), src(found[0].call), src(found[1].call))
	}
	inv := found[0]
	if err := placement(f, inv, src); err != nil {
		return vllmCommand{}, err
	}
	last := inv.call.Args[len(inv.call.Args)-1]
	if l, ok := last.Parts[len(last.Parts)-1].(*syntax.Lit); ok && (len(l.Value)-len(strings.TrimRight(l.Value, `\`)))%2 == 1 {
		return vllmCommand{}, fmt.Errorf("its script's vLLM command ends with a backslash (`%s`), which would join kvroute's flags to its last word; remove it", short(inv, src))
	}
	cmd := vllmCommand{
		flags:   wordArgs(inv.call.Args, text)[inv.start:],
		serving: true,
		script:  &script{node: node, text: text, end: int(last.End().Offset())},
	}
	if err := cmd.check(); err != nil {
		return vllmCommand{}, err
	}
	return cmd, nil
}

// placement refuses a vLLM command inject cannot add flags to: anything
// but a simple command ending the script, after setup commands joined by
// ;, && or newlines.
func placement(f *syntax.File, inv invocation, src func(syntax.Node) string) error {
	refuse := func(where, todo string) error {
		return fmt.Errorf("in its script, `%s` %s; inject adds its flags only to a vLLM command that is a simple command ending the script (setup commands before it joined by ;, && or newlines are fine): %s, or give vLLM's command and flags as lists", short(inv, src), where, todo)
	}
	p := inv.path
	if top := f.Stmts[len(f.Stmts)-1]; p[1] != top {
		return refuse(fmt.Sprintf("is not the script's last command: `%s` is, and flags added at the script's end would go to it", src(lastCommand(top))), "make the vLLM command the last one")
	}
	for i := 1; i < len(p)-1; i++ {
		switch n := p[i].(type) {
		case *syntax.Stmt:
			switch {
			case n.Background:
				return refuse("runs in the background (&)", "run it in the foreground, as the script's last command")
			case n.Negated:
				return refuse("is negated (!)", "drop the !")
			case n.Coprocess:
				return refuse("is a coprocess", "run it in the foreground")
			case len(n.Redirs) > 0:
				return refuse(fmt.Sprintf("is redirected (`%s`)", src(n.Redirs[0])), "drop the redirection (kubectl logs keeps vLLM's output)")
			}
		case *syntax.BinaryCmd:
			switch {
			case n.Op == syntax.AndStmt && p[i+1] == n.X:
				return refuse(fmt.Sprintf("is not the script's last command: `%s` runs after it (&&)", src(lastCommand(n.Y))), "make the vLLM command the last one")
			case n.Op == syntax.AndStmt:
			case n.Op == syntax.OrStmt && p[i+1] == n.X:
				return refuse(fmt.Sprintf("is followed by || `%s`", src(n.Y)), "make the vLLM command the last one")
			case n.Op == syntax.OrStmt:
				return refuse(fmt.Sprintf("runs only if `%s` fails (||)", src(n.X)), "join the commands before it with && or ;")
			case p[i+1] == n.X:
				return refuse(fmt.Sprintf("is piped into `%s`", src(n.Y)), "drop the pipe (kubectl logs keeps vLLM's output)")
			default:
				return refuse(fmt.Sprintf("reads a pipe from `%s`", src(n.X)), "drop the pipe")
			}
		case *syntax.Subshell:
			return refuse("is in a subshell ( … )", "take it out of the subshell")
		case *syntax.Block:
			return refuse("is in a { … } group", "take it out of the group")
		case *syntax.IfClause:
			return refuse("is inside an if", "take it out of the if, as the script's last command")
		case *syntax.WhileClause:
			return refuse("is inside a loop", "take it out of the loop, as the script's last command")
		case *syntax.ForClause:
			return refuse("is inside a for loop", "take it out of the loop, as the script's last command")
		case *syntax.CaseClause:
			return refuse("is inside a case", "take it out of the case, as the script's last command")
		case *syntax.FuncDecl:
			return refuse(fmt.Sprintf("is inside the function %s", n.Name.Value), "run it directly, as the script's last command")
		case *syntax.TimeClause:
			return refuse("runs under time", "drop the time")
		case *syntax.CmdSubst:
			return refuse("is inside a command substitution $( … )", "run it directly, as the script's last command")
		case *syntax.ProcSubst:
			return refuse("is inside a process substitution", "run it directly, as the script's last command")
		case *syntax.CallExpr, *syntax.Word, *syntax.DblQuoted:
			// On the way into a substitution.
		default:
			return refuse(fmt.Sprintf("is inside a %T", n), "run it directly, as the script's last command")
		}
	}
	return nil
}

// short names a vLLM invocation: its command and first argument.
func short(inv invocation, src func(syntax.Node) string) string {
	var words []string
	for i, w := range inv.call.Args {
		if i > inv.start {
			words = append(words, "…")
			break
		}
		words = append(words, src(w))
	}
	return strings.Join(strings.Fields(strings.Join(words, " ")), " ")
}

// lastCommand is the command of stmt that runs last.
func lastCommand(stmt *syntax.Stmt) syntax.Node {
	for {
		b, ok := stmt.Cmd.(*syntax.BinaryCmd)
		if !ok || (b.Op != syntax.AndStmt && b.Op != syntax.OrStmt) {
			return stmt
		}
		stmt = b.Y
	}
}

// snippet is n's source, on one line and cut short.
func snippet(text string, n syntax.Node) string {
	s := strings.Join(strings.Fields(text[n.Pos().Offset():n.End().Offset()]), " ")
	if len(s) > 80 {
		s = s[:77] + "…"
	}
	return s
}

// wordArgs reads a command's words.
func wordArgs(words []*syntax.Word, text string) flagList {
	out := make(flagList, len(words))
	for i, w := range words {
		out[i] = wordArg(w, text)
	}
	return out
}

// wordArg reads a word: its value when it is all literal (plain, quoted,
// escaped), else the literal part before the first expansion.
func wordArg(w *syntax.Word, text string) arg {
	var b strings.Builder
	lit := true
parts:
	for _, p := range w.Parts {
		switch p := p.(type) {
		case *syntax.Lit:
			b.WriteString(unescape(p.Value, false))
		case *syntax.SglQuoted:
			if p.Dollar {
				lit = false
				break parts
			}
			b.WriteString(p.Value)
		case *syntax.DblQuoted:
			for _, q := range p.Parts {
				l, ok := q.(*syntax.Lit)
				if !ok || p.Dollar {
					lit = false
					break parts
				}
				b.WriteString(unescape(l.Value, true))
			}
		default:
			lit = false
			break parts
		}
	}
	return arg{val: b.String(), lit: lit, src: text[w.Pos().Offset():w.End().Offset()]}
}

// unescape removes a shell's backslashes from a literal: outside quotes
// each escapes the next character, inside double quotes only $ ` " \ and
// a newline; a backslash and a newline vanish.
func unescape(s string, dquoted bool) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) || (dquoted && !strings.ContainsRune("$`\"\\\n", rune(s[i+1]))) {
			b.WriteByte(s[i])
			continue
		}
		i++
		if s[i] != '\n' {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
