module github.com/kvroute/kvroute

go 1.26
