package gossip

import (
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logWriter hands memberlist's log lines ("[LEVEL] memberlist: text") to
// zap at the level each names: [DEBUG] debug, [INFO] info, [WARN] warn,
// [ERR] and [ERROR] error; a line without a known level is info.
// memberlist's "Conflicting address" line, which it repeats for every
// gossip message from the claimant, goes to debug: the conflict delegate
// reports each conflict once, at error.
type logWriter struct{ log *zap.Logger }

// memberlistLogger is log named for memberlist's lines, without a caller
// or stack trace (they would point here, not into memberlist).
func memberlistLogger(log *zap.Logger) logWriter {
	return logWriter{log.Named("memberlist").WithOptions(zap.WithCaller(false), zap.AddStacktrace(zapcore.InvalidLevel) /* never */)}
}

func (w logWriter) Write(p []byte) (int, error) {
	level, msg := memberlistLevel(strings.TrimSpace(string(p)))
	if ce := w.log.Check(level, msg); ce != nil {
		ce.Write()
	}
	return len(p), nil
}

// memberlistLevel splits a memberlist log line into its zap level and
// its message (without the level tag and the "memberlist: " prefix).
func memberlistLevel(line string) (zapcore.Level, string) {
	level, msg := zapcore.InfoLevel, line
	if rest, ok := strings.CutPrefix(line, "["); ok {
		if tag, text, ok := strings.Cut(rest, "]"); ok {
			known := true
			switch tag {
			case "DEBUG", "TRACE":
				level = zapcore.DebugLevel
			case "INFO":
				level = zapcore.InfoLevel
			case "WARN":
				level = zapcore.WarnLevel
			case "ERR", "ERROR":
				level = zapcore.ErrorLevel
			default:
				known = false
			}
			if known {
				msg = strings.TrimSpace(text)
			}
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	if strings.HasPrefix(msg, "Conflicting address for ") {
		level = zapcore.DebugLevel
	}
	return level, msg
}
