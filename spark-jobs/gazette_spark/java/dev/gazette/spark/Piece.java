package dev.gazette.spark;

import java.io.BufferedInputStream;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.zip.GZIPInputStream;

import com.github.luben.zstd.ZstdInputStream;
import org.xerial.snappy.SnappyFramedInputStream;

/**
 * Bytes [begin, end) of a journal, read from one fragment file (a {@code file:} path or a
 * signed {@code https:} URL), as the Python source's {@code plan.Piece}. A whole piece
 * (not cut) reads the fragment from its start and checks its SHA-1 and length at its end;
 * a cut one (a part of a split uncompressed fragment) reads its byte range only: with
 * {@code headCut} its first line belongs to the part before, with {@code tailCut} its
 * last line runs on past {@code end}.
 */
final class Piece implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    private static final int BUFFER = 1 << 20;

    final String url;
    final String where;
    final String codec;
    final long fragmentBegin;
    final long fragmentEnd;
    final String sha1;
    final long begin;
    final long end;
    final boolean headCut;
    final boolean tailCut;

    Piece(String url, String where, String codec, long fragmentBegin, long fragmentEnd,
          String sha1, long begin, long end, boolean headCut, boolean tailCut) {
        this.url = url;
        this.where = where;
        this.codec = codec;
        this.fragmentBegin = fragmentBegin;
        this.fragmentEnd = fragmentEnd;
        this.sha1 = sha1;
        this.begin = begin;
        this.end = end;
        this.headCut = headCut;
        this.tailCut = tailCut;
    }

    boolean cut() {
        return headCut || tailCut;
    }

    /** The fragment file's bytes from {@code at} (a file offset: cut pieces only). */
    InputStream open(long at) throws IOException {
        if (url.startsWith("file:")) {
            FileInputStream in = new FileInputStream(new java.io.File(URI.create(url)));
            if (at > 0) {
                in.getChannel().position(at);
            }
            return in;
        }
        HttpURLConnection conn = (HttpURLConnection) URI.create(url).toURL().openConnection();
        conn.setConnectTimeout(30_000);
        conn.setReadTimeout(120_000);
        if (at > 0) {
            conn.setRequestProperty("Range", "bytes=" + at + "-");
        }
        int status = conn.getResponseCode();
        if (status != 200 && status != 206) {
            throw new IOException("GET answered HTTP " + status);
        }
        InputStream in = conn.getInputStream();
        if (at > 0 && status == 200) {
            in.skipNBytes(at);
        }
        return in;
    }

    /** The fragment's content (decompressed) from its start. */
    InputStream content() throws IOException {
        InputStream raw = new BufferedInputStream(open(0), BUFFER);
        switch (codec) {
            case "NONE":
                return raw;
            case "GZIP":
            case "GZIP_OFFLOAD_DECOMPRESSION":
                return new GZIPInputStream(raw, BUFFER);
            case "ZSTANDARD":
                return new ZstdInputStream(raw);
            case "SNAPPY":
                return new SnappyFramedInputStream(raw, true);
            default:
                throw new IOException("codec " + codec + " is not read natively");
        }
    }

    static MessageDigest sha1Digest() {
        try {
            return MessageDigest.getInstance("SHA-1");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /** Whether the content's digest and length are the fragment's. */
    String mismatch(MessageDigest digest, long length) {
        long want = fragmentEnd - fragmentBegin;
        if (length != want) {
            return "its content is " + length + " bytes, not " + want;
        }
        String got = HexFormat.of().formatHex(digest.digest());
        if (!got.equals(sha1)) {
            return "its content's SHA-1 is " + got + ", not " + sha1
                + " (a corrupt or changed fragment)";
        }
        return null;
    }

    /** The error a read of this piece fails with, as the Python source words it. */
    RuntimeException lost(String journal, Throwable cause) {
        String why = cause.getMessage() == null ? cause.toString() : cause.getMessage();
        return new IllegalStateException("DataLoss: " + journal + ": fragment " + where + " ["
            + begin + ", " + end + ") cannot be read: " + why
            + " (failOnDataLoss=false skips it)", cause);
    }
}
