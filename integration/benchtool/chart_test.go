package main

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// The chart must be a decodable PNG whose size grows with the number of cases.
func TestDrawChart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.png")
	bars := []bar{
		{"veth pair", "guest -> host", 25.1}, {"veth pair", "host -> guest", 30.2},
		{"tapgro GRO on", "guest -> host", 5.6}, {"tapgro GRO on", "host -> guest", 5.0},
	}
	if err := drawChart(path, "test", []string{"guest -> host", "host -> guest"}, bars); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 100 {
		t.Fatalf("chart is %v", b)
	}
}

// TestStatCPU: the /proc stat parser behind every CPU figure reads this process's own.
func TestStatCPU(t *testing.T) {
	name, total, sys, ok := statCPU("/proc/self/stat")
	if !ok || name == "" || total < sys || sys < 0 {
		t.Fatalf("statCPU(/proc/self/stat) = %q, %v, %v, %v", name, total, sys, ok)
	}
	if _, _, _, ok := statCPU("/proc/self/nonexistent"); ok {
		t.Fatal("a missing file parsed")
	}
}
