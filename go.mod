module github.com/groupkv/groupkv

go 1.26.8
