package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// A small horizontal grouped bar chart, drawn by hand: the benchmark's chart needs one
// font and rectangles, not a plotting library's dependency tree.

type bar struct {
	label  string // the case (one group of bars)
	series string // the direction (one colour)
	value  float64
}

var palette = []color.RGBA{{0x1f, 0x77, 0xb4, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}}

func drawChart(path, title string, series []string, bars []bar) error {
	const (
		barH  = 14
		gap   = 10
		left  = 10
		plotW = 460
		top   = 50
	)
	var groups []string
	seen := map[string]bool{}
	maxV := 0.0
	labelW := 330 // wide enough for the longest label in basicfont's 7-pixel cells
	for _, b := range bars {
		if !seen[b.label] {
			seen[b.label] = true
			groups = append(groups, b.label)
			labelW = max(labelW, 7*len(b.label)+16)
		}
		maxV = max(maxV, b.value)
	}
	if maxV == 0 {
		maxV = 1
	}
	groupH := len(series)*barH + gap
	height := top + len(groups)*groupH + 40
	width := left + labelW + plotW + 80
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	text(img, left, 18, title, color.Black)
	for i, s := range series {
		x := left + labelW + i*170
		fill(img, x, 28, x+12, 40, palette[i%len(palette)])
		text(img, x+16, 38, s, color.Black)
	}
	x0 := left + labelW
	for gi, g := range groups {
		y := top + gi*groupH
		text(img, left, y+barH+4, g, color.Black)
		for si, s := range series {
			for _, b := range bars {
				if b.label != g || b.series != s {
					continue
				}
				w := int(b.value / maxV * plotW)
				by := y + si*barH
				fill(img, x0, by, x0+w, by+barH-2, palette[si%len(palette)])
				text(img, x0+w+4, by+barH-3, fmt.Sprintf("%.2f", b.value), color.Black)
			}
		}
	}
	// Axis line.
	fill(img, x0-1, top-4, x0, height-30, color.RGBA{0x60, 0x60, 0x60, 0xff})
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fill(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	draw.Draw(img, image.Rect(x0, y0, x1, y1), image.NewUniform(c), image.Point{}, draw.Src)
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
